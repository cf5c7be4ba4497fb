/*
 * tests/test_models.c - third-party model code under capd's defaults: the
 * user models of examples/models (torchvision architectures outside the
 * zoo, torchaudio models) run by the real capd and Debian's torch at every
 * width this host runs, forward and backward. With the default memory
 * limits (no address-space cap, a cgroup or the watchdog) every cell must
 * end ok, and the same build compared with itself must pass on numerics
 * with no outcome change (issue 17: allocations failing under an
 * address-space cap turned such cells into failures that came and went).
 */
#include <criterion/criterion.h>

#include "tests/helpers/common/models_aa.h"
#include "tests/helpers/common/testutil.h"

/* Two of each kind keep the suite short; examples/models has more. */
static const char *const models =
    "\"capd_examples.vision:squeezenet1_1\",\"capd_examples.vision:shufflenet_v2_x0_5\","
    "\"capd_examples.audio:conv_tasnet\",\"capd_examples.audio:conformer\"";
#define N_MODELS 4

Test(models, examples_ok_at_every_width_and_aa_pass, .timeout = 1200)
{
    struct tu_capd c;
    /* The defaults, but two cells at a time: what an operator changes. */
    const char *extra[] = {"--max-parallel", "2", NULL};
    cr_assert_eq(tu_capd_start(&c, NULL, extra), 0);
    ma_register(&c, "debian", tu_python());
    ma_models_aa(&c, "debian", models, N_MODELS);
    cr_assert_eq(tu_capd_stop(&c), 0);
}
