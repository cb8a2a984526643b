"""The C part of llama-srb: four loops over a logits row (llama_srb/sampling/_rows.c) that
numpy makes slowly. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "llama_srb.sampling._rows",
            ["llama_srb/sampling/_rows.c"],
            # no traps: lets GCC vectorize the selects of its loops (the results are the same)
            extra_compile_args=["-O3", "-fno-trapping-math"],
        )
    ]
)
