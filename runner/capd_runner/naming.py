"""Module names as record keys use them (capd_runner/capture.py): the
table of a model's modules and their fully qualified names, the root as
``model``, and names made safe for a key.
"""

# The protocol caps keys at 512 bytes and forbids control characters.
MAX_FQN = 400


def safe_fqn(name):
    """Module fqn usable in a key: control characters become '?', and an
    over-long name keeps its start plus a short hash of the whole."""
    if name.isprintable() and (len(name) <= MAX_FQN // 4
                               or len(name.encode("utf-8")) <= MAX_FQN):
        return name  # the common case: no C0/C1/DEL (not printable) and short
    name = "".join(c if (ord(c) >= 0x20 and not 0x7f <= ord(c) <= 0x9f) else "?" for c in name)
    raw = name.encode("utf-8")
    if len(raw) <= MAX_FQN:
        return name
    import hashlib
    digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
    return raw[:MAX_FQN - 20].decode("utf-8", "ignore") + "~" + digest


def param_owner(name):
    owner, _dot, local = name.rpartition(".")
    return safe_fqn(owner) if owner else "model", safe_fqn(local)


def module_names(model):
    """({id(module): fqn}, [module], whether a module has forward hooks of its
    own) of model.named_modules(): the same modules, order and names (a module
    reached twice keeps its first name), the root as "model", walked without a
    generator per level (a capture makes this table each time, and
    named_modules costs it twice as much)."""
    names, modules, hooked = {}, [], False
    stack = [("", model)]
    pop, push = stack.pop, stack.append
    while stack:
        name, m = pop()
        mid = id(m)
        if mid in names:
            continue
        names[mid] = safe_fqn(name) if name else "model"
        modules.append(m)
        if m._forward_pre_hooks or m._forward_hooks:
            hooked = True
        kids = m._modules
        if kids:
            pre = name + "." if name else ""
            for local, child in reversed(kids.items()):
                if child is not None:
                    push((pre + local, child))
    return names, modules, hooked
