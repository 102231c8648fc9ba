"""Calibration: measure a machine's collectives and kernels, and fit them into a hardware profile.

``advisor calibrate`` (advisor/cli_calibrate.py) is the command; this package is what it runs:

- measurements.py  read and check results JSONL, nccl-tests CSVs and the reference kernel/optimizer files
- fitting.py       the numerical machinery: log-time least squares, a minimax polish, fit reports
- links.py         one link class's CommFit from a collective sweep (and its low-latency path)
- network.py       the inter-node link from collectives over every GPU of several nodes
- compute.py       GEMM, fused-attention, copy, element-wise and optimizer efficiencies
- profile.py       a whole profile refitted on a base profile, with a report line per fit
- output.py        where the profile is written (atomically, never over a shipped profile), and the lock that
                   keeps two calibrations off one --out
- timing.py        a call timed on every rank of a group alike
- overlap.py       a GEMM loop alone and beside an all-gather: the SMs NCCL holds (torch inside its functions only)
- microbench.py    the torch.distributed worker that measures (torch imported inside its functions only)
- lifeline.py      a worker dies with the launcher that started it
- progress.py      the time a sweep has left
- launch.py        start local workers (bounded, isolated from the working directory), watch them, stop them

Imports flow one way: measurements, fitting -> links, network, compute -> profile; output; lifeline, timing -> overlap ->
microbench -> progress -> launch. torch is imported only inside microbench's functions, never at module level.
"""

from advisor.calibrate.compute import fit_efficiency
from advisor.calibrate.fitting import FitReport, fit_report
from advisor.calibrate.launch import launch_local
from advisor.calibrate.links import collective_points, fit_link, fit_low_latency, link_report
from advisor.calibrate.measurements import (
    COLLECTIVES,
    CalibrationError,
    on_cpu_note,
    parse_sizes,
    read_results,
    repair_torn_tail,
)
from advisor.calibrate.microbench import BenchConfig, measurement_plan, run_worker
from advisor.calibrate.network import fit_world
from advisor.calibrate.output import refuse_shipped, write_profile
from advisor.calibrate.profile import calibrate_profile

__all__ = [
    "COLLECTIVES",
    "BenchConfig",
    "CalibrationError",
    "FitReport",
    "calibrate_profile",
    "collective_points",
    "fit_efficiency",
    "fit_link",
    "fit_low_latency",
    "fit_report",
    "fit_world",
    "launch_local",
    "link_report",
    "measurement_plan",
    "on_cpu_note",
    "parse_sizes",
    "read_results",
    "refuse_shipped",
    "repair_torn_tail",
    "run_worker",
    "write_profile",
]
