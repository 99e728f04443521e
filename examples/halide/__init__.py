"""Halide applications ported to Python from the Halide repository's apps, one module each
(APPS below), all with the same interface:

    build() -> common.App          fresh Funcs and Params: outputs, params (infer_arguments order), stages
    inputs(rng, size="small"|"bench") -> list   arguments in params order
    output_shapes(args) -> list[tuple]          row-major shapes of the outputs
    reference(*args) -> list[np.ndarray]        an independent numpy implementation
    schedule_cpu(app), schedule_gpu(app)        the app's manual schedules (schedule_gpu
                                                where the app has one: linear_blur has none)
    tolerance(args) (float apps)                the absolute error the comparison allows

and optionally UNSCHEDULED = "infeasible" | "slow" where realizing with everything inlined
cannot run (pyramids, long stencil chains) or takes seconds. common.realize(app, args,
shapes) runs Halide; tests/test_halide_apps.py checks each against its reference and
benchmarks/halide_bench.py times them.
"""

# every ported app; the first nine were ported before issue 27, the others for it. `app:variant`
# names another variant of an app whose module builds several (resize, gaussian_blur: the
# module's VARIANTS; the plain name is its DEFAULT_VARIANT).
APPS = ["blur", "erode", "matmul", "conv_layer", "stencil_chain", "harris", "interpolate",
        "bilateral_grid", "local_laplacian",
        "camera_pipe", "unsharp", "hist", "max_filter", "linear_blur", "depthwise_separable_conv",
        "resize", "resize:lanczos_float32_up", "resize:linear_float32_down", "gaussian_blur",
        "gaussian_blur:direct", "iir_blur", "nl_means", "lens_blur"]


def load(name: str):
    """The module of app `name`, or for `app:variant` that variant's namespace (the same names
    as a module's)."""
    import importlib
    base, _, variant = name.partition(":")
    module = importlib.import_module(f"examples.halide.{base}")
    return module.variant(variant) if variant else module
