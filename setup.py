"""The C part of llama-srb: five loops that numpy makes slowly, over a logits row or backend
sampling's candidates (llama_srb/sampling/_rows.c), two of them vectorized; and the device's
cut as a graph op on the CPU (llama_srb/_cpu_cut.c). Everything else is in
pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "llama_srb.sampling._rows",
            ["llama_srb/sampling/_rows.c"],
            # no traps: GCC vectorizes exp_sum's selects below AVX-512 too (same results)
            extra_compile_args=["-O3", "-fno-trapping-math"],
        ),
        Extension(
            "llama_srb._cpu_cut",
            ["llama_srb/_cpu_cut.c"],
            extra_compile_args=["-O3", "-fno-trapping-math"],
        ),
    ]
)
