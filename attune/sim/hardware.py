"""Accelerator and node specifications used by the simulator.

Peak numbers are dense (no sparsity) vendor figures:

* A100-SXM4-80GB: 312 TFLOP/s BF16, no FP8, 80 GB HBM2e at 2.039 TB/s, NVLink 3 600 GB/s per GPU
  (300 GB/s per direction), HDR InfiniBand 200 Gb/s per GPU (NVIDIA A100 datasheet; DGX A100 user guide).
* H100-SXM5-80GB: 989.4 TFLOP/s BF16, 1978.9 FP8, 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s per GPU
  (450 per direction), NDR 400 Gb/s = 50 GB/s per GPU per direction (glennklockwood.com H100 page; DGXC
  reference architecture; knobs-and-sim.md §5.3, §5.6).
* H200-SXM: H100 compute, 141 GB HBM3e at 4.8 TB/s (NVIDIA H200 spec; NIM support matrix), same fabric.
* B200 (DGX B200): 2250 TFLOP/s BF16, 4500 FP8, 180 GB HBM3e at 7.7 TB/s, NVLink 5 1.8 TB/s per GPU
  (900 per direction), 8 x 400 Gb/s IB per node (dgxc-benchmarking README; knobs-and-sim.md §5.6).

Achievable fractions (``*_eff``) are physical ceilings, not per-row fits: cuBLAS reaches ~75-80 % of dense
BF16 peak on large GEMMs and ~65-70 % of FP8 peak on Hopper; NCCL ring bus bandwidth reaches ~80 % of the
NVLink per-direction rate (8xH100 all-reduce busbw 460-480 GB/s with NVLS, ~360-380 without) and ~80-90 % of
the IB line rate (nccl-tests; knobs-and-sim.md §5.3). On B200 (1000 W, power-capped clocks, early 2025 kernels)
large GEMMs reach less of the paper peak: SimuMax's measured B200 BF16 table gives 0.39-0.65 of peak for
Llama-70B shapes (knobs-and-sim.md §5.2), hence lower ceilings there. Latencies are NCCL per-hop orders of magnitude.

Usable memory (``hbm_usable_mib``) is the total ``nvidia-smi`` reports: the "80 GB" parts have 80 GiB
(81559 MiB on H100, 81251 MiB on A100), H200 143771 MiB, B200 183359 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

TB = 1e12
GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """One accelerator type in an 8-GPU node: compute peaks, memory, interconnect."""

    name: str
    peak_bf16_tflops: float
    peak_fp8_tflops: float | None
    hbm_gb: float
    hbm_usable_mib: float
    hbm_bw_tbs: float
    nvlink_gbs_per_dir: float
    ib_gbs_per_gpu: float
    sms: int
    gpus_per_node: int = 8
    gemm_eff_bf16: float = 0.70
    gemm_eff_fp8: float = 0.68
    attn_eff: float = 0.60
    nvlink_eff: float = 0.80
    nvls_speedup: float = 1.25
    ib_eff: float = 0.85
    nvlink_alpha_s: float = 4e-6
    ib_alpha_s: float = 12e-6
    launch_s: float = 5e-6
    fp8_transformer_engine_gen: int = 1

    @property
    def peak_bf16(self) -> float:
        """Dense BF16 peak in FLOP/s."""
        return self.peak_bf16_tflops * 1e12

    @property
    def peak_fp8(self) -> float | None:
        """Dense FP8 peak in FLOP/s (None if unsupported)."""
        return None if self.peak_fp8_tflops is None else self.peak_fp8_tflops * 1e12

    @property
    def hbm_capacity_bytes(self) -> float:
        """Memory a process can allocate, as ``nvidia-smi`` reports it (MiB), in bytes."""
        return self.hbm_usable_mib * 2**20

    @property
    def hbm_bw(self) -> float:
        """HBM bandwidth in bytes/s."""
        return self.hbm_bw_tbs * TB

    @property
    def nvlink_bw(self) -> float:
        """Achievable NVLink bus bandwidth per GPU per direction, bytes/s."""
        return self.nvlink_gbs_per_dir * GB * self.nvlink_eff

    @property
    def ib_bw(self) -> float:
        """Achievable InfiniBand bandwidth per GPU per direction, bytes/s."""
        return self.ib_gbs_per_gpu * GB * self.ib_eff


HARDWARE: dict[str, Hardware] = {
    "a100-80gb": Hardware(name="A100-SXM4-80GB", peak_bf16_tflops=312.0, peak_fp8_tflops=None, hbm_gb=80.0, hbm_usable_mib=81251,
                          hbm_bw_tbs=2.039, nvlink_gbs_per_dir=300.0, ib_gbs_per_gpu=25.0, sms=108,
                          launch_s=6e-6),
    "h100-sxm-80gb": Hardware(name="H100-SXM5-80GB", peak_bf16_tflops=989.4, peak_fp8_tflops=1978.9, hbm_gb=80.0, hbm_usable_mib=81559,
                              hbm_bw_tbs=3.35, nvlink_gbs_per_dir=450.0, ib_gbs_per_gpu=50.0, sms=132),
    "h200": Hardware(name="H200-SXM-141GB", peak_bf16_tflops=989.4, peak_fp8_tflops=1978.9, hbm_gb=141.0, hbm_usable_mib=143771,
                     hbm_bw_tbs=4.8, nvlink_gbs_per_dir=450.0, ib_gbs_per_gpu=50.0, sms=132),
    "b200": Hardware(name="B200-180GB", peak_bf16_tflops=2250.0, peak_fp8_tflops=4500.0, hbm_gb=180.0, hbm_usable_mib=183359,
                     hbm_bw_tbs=7.7, nvlink_gbs_per_dir=900.0, ib_gbs_per_gpu=50.0, sms=148,
                     gemm_eff_bf16=0.62, gemm_eff_fp8=0.55, attn_eff=0.50, fp8_transformer_engine_gen=2),
}


def get_hardware(accelerator: str) -> Hardware:
    """The :class:`Hardware` of a ``resources.accelerator`` name; raises ``ValueError`` for unknown/CPU."""
    if accelerator not in HARDWARE:
        raise ValueError(
            f"resources.accelerator {accelerator!r} cannot be simulated; use one of {sorted(HARDWARE)}")
    return HARDWARE[accelerator]
