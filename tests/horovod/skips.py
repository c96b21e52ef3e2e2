"""Tests of Horovod's test_torch.py that trainrun skips, each with its reason.

Only reasons a Horovod maintainer would accept belong here: hardware or builds this machine does
not have, or a documented difference in design. Tests not named here must pass.
"""

SKIPS = {}

# Skipped only at some job sizes.
SKIPS_AT_SIZE = {
    3: {
        # With 3 ranks and tolerance 0 these compare a float16 result against 3 * h computed in
        # float32, which float16 cannot hold (e.g. 43.1016 against 43.0938): any float16 sum fails
        # them by construction. Their other dtypes pass at 3 ranks (checked separately) and every
        # dtype passes at 2.
        name: "float16 sum of 3 compared with tolerance 0 against a value float16 cannot hold"
        for name in ("test_horovod_allreduce_prescale", "test_horovod_reducescatter_prescale",
                     "test_horovod_grouped_reducescatter_prescale")
    },
}
