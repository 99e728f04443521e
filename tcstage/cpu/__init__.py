"""The structure-aware CPU scheduler: Halide schedules derived from what each Func of a lowered
TC computes (structure.py, scheduler.py), their parameters as a `CpuSchedule` chain
(options.py), and a measured search over them (tune.py). See docs/cpu.md."""
