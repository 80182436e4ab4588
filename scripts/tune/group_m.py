"""GROUP_M 8 against 16 at large GEMM shapes: the two 128x256 configs under each, timed twice in
turn (do_bench, us, cuBLAS / ours), then matmul() as shipped and the config the autotuner picked.

    python scripts/tune/group_m.py      (~45 s on an H100)
"""

import torch
import triton.testing

import llmk.gemm.matmul_ops as tm
import llmk.gemm.triton_matmul_tiled as tiled
from llmk.gemm.triton_matmul_common import picked_config

SHIPPED = tiled.GROUP_M  # launch_tiled reads the tiled module's name, so that is the one swapped


def us(fn):
    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


for dtype in (torch.bfloat16, torch.float16):
    for m, n, k in (
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (2048, 14336, 4096),
        (8192, 14336, 4096),
        (4096, 4096, 14336),
    ):
        a, b = torch.randn(m, k, device="cuda").to(dtype), torch.randn(k, n, device="cuda").to(dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        res = {}
        for rep in range(2):
            res.setdefault("cuBLAS", []).append(us(lambda: torch.matmul(a, b)))
            for g in (8, 16):
                tiled.GROUP_M = g
                for cfg in ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4)):

                    def fn():
                        return tm.launch_matmul(a, b, None, None, c, config=cfg)

                    fn()
                    res.setdefault(f"G{g} s{cfg[4]}", []).append(us(fn))
        tiled.GROUP_M = SHIPPED
        tm.matmul(a, b)
        pick = picked_config(tiled._matmul_kernel, a, b, m, n, k)
        res["auto"] = [us(lambda: tm.matmul(a, b))]
        cub = min(res["cuBLAS"])
        print(
            f"{str(dtype)[6:]} {m}x{n}x{k}: "
            + " | ".join(f"{kk} {min(v):.1f} ({cub / min(v):.3f})" for kk, v in res.items())
            + f" pick {pick['BLOCK_M']}x{pick['BLOCK_N']}x{pick['BLOCK_K']}"
            f" s{pick['num_stages']} G{pick['GROUP_M']}",
            flush=True,
        )
