"""The C part of llama-srb: four loops over a logits row (llama_srb/sampling/_rows.c) that
numpy makes slowly, two of them vectorized. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "llama_srb.sampling._rows",
            ["llama_srb/sampling/_rows.c"],
            # no traps: GCC vectorizes exp_sum's selects below AVX-512 too (same results)
            extra_compile_args=["-O3", "-fno-trapping-math"],
        )
    ]
)
