"""Example user models for capd (docs/runner.md, "User models").

Third-party model code from Debian's packages (torchvision architectures
outside capd's zoo, torchaudio models) behind factories named
``capd_examples.vision:<name>`` and ``capd_examples.audio:<name>``. Register a
build with this directory (examples/models) in its ``model_roots``.
"""
