"""Tests of the Gluon forward for sm_90 (attention/gluon_flash_attention_fwd.py), the dispatch
that picks it (attention/attention_paths.py) and the Gluon kernels of the backward
(attention/gluon_flash_attention_bwd.py, through launch_flash_attention_backward's gluon):

    python attention/test_gluon_attention.py        (or: pytest attention/test_gluon_attention.py)

Every forward case of attention/test_flash_attention.py (O and LSE, dense and packed, every mask)
again on the Gluon path, with the same references and tolerances; the configs the A/B weighs
beside the table's, into poisoned outputs; the dispatch's routing and errors; dq, dk, dv from the
Gluon backward kernels, under the tl backward's tolerances, and a packed batch's against the same
kernels' dense launches. Gluon does not run
in Triton's interpreter: there only the dispatch case runs (the tl path is what a CPU gets), and
the rest are GPU cases. A script of its own so that `make test JOBS=4` runs it beside the tl
kernel's cases: on an H200 each half takes minutes.
"""

import dataclasses
import math
import os

import torch
import triton

from llmk.attention.attention_checks import attention_mask
from llmk.attention.attention_paths import (
    GLUON_HEAD_DIMS,
    GLUON_TRITON_VERSIONS,
    PATH_ENV,
    auto_takes_gluon,
    forced_path,
    gluon_forward,
    gluon_runs_here,
    path_setting,
)
from llmk.attention.flash_attention_ops import (
    flash_attention,
    flash_attention_train_op,
    flash_attention_varlen_train_op,
    packed,
)
from llmk.attention.test_flash_attention import CASES as TL_CASES
from llmk.attention.test_flash_attention import (
    EXACT,
    attention_and_lse,
    check,
    check_backward_forced,
    check_lse,
    compare_o,
    cumulative,
    lse_tol,
    make_qkv,
    varlen_gluon_cases,
)
from llmk.attention.triton_flash_attention_bwd import launch_flash_attention_backward
from llmk.attention.triton_flash_attention_fwd import MAX_GRID_Y
from llmk.common.device import DEVICE, INTERPRET
from llmk.common.environment import environment
from llmk.devtools.testing import (
    Case,
    Outcome,
    Skip,
    compare,
    expect_raises,
    main,
    poisoned,
    rand,
    table_entry,
)


def check_gluon_dispatch():
    """With LLMK_ATTENTION_PATH=gluon on an sm_90 GPU with a tested Triton, dense and packed calls
    of the Gluon head dims take the Gluon forward; other head dims, a forced config, a TMA-illegal
    layout and LLMK_ATTENTION_PATH=tl take the tl one; "auto", the default, takes the tl one on
    AUTO_TL_SHAPES only; a bad value raises."""
    outcomes = []
    q, k, v = make_qkv(1, 2, 2, 8, 8, 64, torch.bfloat16)
    with environment(PATH_ENV, "bogus"):
        outcomes.append(
            expect_raises("LLMK_ATTENTION_PATH=bogus", lambda: flash_attention(q, k, v), ValueError, PATH_ENV)
        )

    def bogus_forced_path():
        with forced_path("bogus"):
            pass

    outcomes.append(expect_raises("forced_path('bogus')", bogus_forced_path, ValueError, "path"))
    from llmk.attention.gluon_flash_attention_fwd import GLUON_CONFIG_TABLE

    table_dims = tuple(sorted({row[0] for row in GLUON_CONFIG_TABLE}))
    outcomes.append(
        Outcome(
            "the dispatch's head dims are the Gluon table's",
            table_dims == GLUON_HEAD_DIMS,
            note=f"{GLUON_HEAD_DIMS} vs {table_dims}",
        )
    )
    keys = {row[:2] for row in GLUON_CONFIG_TABLE}  # gluon_config raises for a head dim and mask it lacks
    outcomes.append(
        Outcome(
            "the Gluon table has a full and a causal row a head dim",
            keys == {(d, c) for d in GLUON_HEAD_DIMS for c in (False, True)},
            note=str(sorted(keys)),
        )
    )
    unset = os.environ.pop(PATH_ENV, None)
    try:
        outcomes.append(Outcome(f"{PATH_ENV} unset: auto", path_setting() == "auto"))
    finally:
        if unset is not None:
            os.environ[PATH_ENV] = unset
    outcomes += [
        Outcome(f"auto_takes_gluon{args}: {want}", auto_takes_gluon(*args) == want)
        for args, want in (
            ((64, True, 1024), False),
            ((64, True, 1025), True),
            ((64, False, 512), True),
            ((128, True, 512), True),
        )
    ]
    if INTERPRET:
        with forced_path("gluon"):
            outcomes.append(
                Outcome(
                    "interpreter: tl forward",
                    not gluon_forward(q, k, v, False, q, None, None, None) and not gluon_runs_here(),
                )
            )
        lse = torch.zeros(q.shape[:3], device=DEVICE)
        outcomes.append(
            expect_raises(
                "interpreter: the Gluon backward raises",
                lambda: launch_flash_attention_backward(
                    q, q, k, v, q, lse, *(torch.empty_like(t) for t in (q, k, v)), False, 0.1, gluon=("dkdv", "dq")
                ),
                ValueError,
                "gluon",
            )
        )
        return outcomes
    if triton.__version__ not in GLUON_TRITON_VERSIONS or torch.cuda.get_device_capability() != (9, 0):
        raise Skip(
            f"the Gluon forward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}; here "
            f"{torch.cuda.get_device_capability()} and Triton {triton.__version__}"
        )

    def gluon(q, k, v, cu_seqlens=None, config=None, path="gluon", causal=False):
        with forced_path(path):
            return gluon_forward(q, k, v, causal, q, None, cu_seqlens, config)

    outcomes.append(Outcome("gluon_runs_here()", gluon_runs_here()))
    for d in (64, 128):
        q, k, v = make_qkv(2, 4, 2, 100, 100, d, torch.bfloat16)
        two, many = cumulative([60, 40]), torch.zeros(MAX_GRID_Y // 4 + 2, dtype=torch.int32, device=DEVICE)
        outcomes += [
            Outcome(f"D{d} dense: gluon", gluon(q, k, v)),
            Outcome(f"D{d} LLMK_ATTENTION_PATH=tl: tl", not gluon(q, k, v, path="tl")),
            Outcome(f"D{d} packed: gluon", gluon(q, k, v, cu_seqlens=(two, two, 60))),
            Outcome(
                f"D{d} packed, over {MAX_GRID_Y} (sequence, head) pairs: gluon",
                gluon(q, k, v, cu_seqlens=(many, many, 0)),
            ),
            Outcome(f"D{d} forced config: tl", not gluon(q, k, v, config=[64, 64, 4, 3])),
            Outcome(f"D{d} T100 full, auto: gluon", gluon(q, k, v, path="auto")),
            Outcome(
                f"D{d} T100 causal, auto: {'tl' if d == 64 else 'gluon'}",
                gluon(q, k, v, path="auto", causal=True) == (d != 64),
            ),
        ]
        q2k, k2k, v2k = make_qkv(1, 2, 2, 2048, 2048, d, torch.bfloat16)
        short = cumulative([60] * 34 + [8])  # 2048 tokens in all, the longest sequence 60
        outcomes += [
            Outcome(f"D{d} T2048 causal, auto: gluon", gluon(q2k, k2k, v2k, path="auto", causal=True)),
            Outcome(
                f"D{d} packed causal, 2048 tokens, longest 60, auto: {'tl' if d == 64 else 'gluon'}",
                gluon(q2k, k2k, v2k, cu_seqlens=(short, short, 60), path="auto", causal=True) == (d != 64),
            ),
        ]
    q, k, v = make_qkv(2, 4, 2, 100, 100, 96, torch.bfloat16)
    odd = rand((1, 2, 50, 65), torch.bfloat16)[..., :64]  # token stride 130 bytes: not TMA-legal
    outcomes += [
        Outcome("D96: tl", not gluon(q, k, v)),
        Outcome("token stride not 16-byte aligned: tl", not gluon(odd, odd, odd)),
    ]
    return outcomes + backward_dispatch(odd)


def backward_dispatch(odd):
    """The backward's routing (attention_paths.gluon_backward): launch_flash_attention_backward
    returns None when the Gluon kernels ran, the tl kernels otherwise."""

    def takes_gluon(d=128, path="auto", mask=None, causal=True, t=100, layout=None, packed_batch=False, **kw):
        q, k, v = (layout,) * 3 if layout is not None else make_qkv(2, 4, 2, t, t, d, torch.bfloat16)
        if packed_batch:  # the two batch rows as a packed batch of two sequences, (1, H, total, D) views
            q, k, v = (packed(x.transpose(1, 2).reshape(-1, *x.shape[1::2])) for x in (q, k, v))
            cu = cumulative([t, t])
            kw = dict(kw, cu_seqlens=(cu, cu, t, t))
        lse = torch.zeros(q.shape[:3], device=DEVICE)
        with forced_path(path):
            return (
                launch_flash_attention_backward(
                    q,
                    q,
                    k,
                    v,
                    q,
                    lse,
                    *(torch.empty_like(x) for x in (q, k, v)),
                    causal,
                    0.1,
                    mask=mask or attention_mask((-1, -1), 0.0),
                    **kw,
                )
                is None
            )

    return [
        Outcome("backward D128 auto: gluon", takes_gluon()),
        Outcome("backward D64 auto, deterministic: gluon", takes_gluon(64, deterministic=True)),
        Outcome("backward D128 gluon: gluon", takes_gluon(path="gluon")),
        Outcome("backward D128 LLMK_ATTENTION_PATH=tl: tl", not takes_gluon(path="tl")),
        Outcome("backward D128 window: gluon", takes_gluon(mask=attention_mask((32, 0), 0.0))),
        Outcome("backward D64 softcap: gluon", takes_gluon(64, mask=attention_mask((-1, -1), 30.0))),
        Outcome("backward D128 packed: gluon", takes_gluon(packed_batch=True)),
        Outcome("backward D128 dq_add forced: tl", not takes_gluon(dq_add="atomics")),
        Outcome("backward D96: tl", not takes_gluon(96)),
        Outcome("backward token stride not 16-byte aligned: tl", not takes_gluon(layout=odd)),
    ]


def gluon_forward_cases():
    """Every forward case (O and LSE) again with LLMK_ATTENTION_PATH=gluon: on an sm_90 GPU the
    Gluon forward passes the same cases as the tl kernel with the same tolerances (the row's note
    names the kernel that ran)."""
    return [
        Case(f"{c.name} [gluon forward]", c.fn, dict(c.kwargs, path="gluon"), gpu_only=True)
        for c in TL_CASES
        if c.fn in (check, check_lse)
    ]


def check_gluon_config(config, b, h, hkv, tq, tk, d, dtype, causal, window=None, softcap=None):
    """The Gluon forward launched with `config` (BLOCK_M, BLOCK_N, STAGES, PINGPONG, SPLIT_RELEASE,
    GRID) into poisoned O and LSE, twice (the second launch into fresh poison: a dynamic grid's
    counter must start at zero again): O against the reference (attention_tol, the 2x rule), LSE
    against the fp64 logsumexp (lse_tol). For configs the table does not hold yet, the persistent
    grids' above all: tiles with no keys, key counts no multiple of STAGES, many tiles a program."""
    if not gluon_runs_here():
        raise Skip(f"the Gluon forward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}")
    from llmk.attention.gluon_flash_attention_fwd import DYNAMIC, _tile_counter, launch_gluon_attention

    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype)
    scale = 1.0 / math.sqrt(d)
    for _ in range(2):
        out, lse = poisoned((b, h, tq, d), dtype), poisoned((b, h, tq), torch.float32)
        launch_gluon_attention(q, k, v, out, causal, scale, lse, attention_mask(window, softcap), config)
    _, ref_lse = attention_and_lse(q.double(), k.double(), v.double(), causal, scale, window, softcap)
    outcomes = [compare_o(out, q, k, v, causal, scale, window, softcap), compare("LSE", lse, ref_lse, lse_tol(softcap))]
    if config[5] == DYNAMIC:  # the launch's last grab put the stream's counter back
        left = _tile_counter(q.device).item()
        outcomes.append(Outcome("the tile counter is zero after the launch", left == 0, note=f"{left}"))
    return outcomes


def check_dynamic_counter(b, h, t, d):
    """The dynamic deal reads its counter (a static deal run by mistake would not): with the
    stream's counter set to n_tiles - P before a launch, every program's first grab falls past the
    last tile, so only the first lap of tiles (P of n_tiles) is written, the rest keep their
    poison; and those P grabs end on n_tiles - 1, which puts the counter back to zero."""
    if not gluon_runs_here():
        raise Skip(f"the Gluon forward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}")
    from llmk.attention.gluon_flash_attention_fwd import (
        DYNAMIC,
        _tile_counter,
        gluon_attention_args,
        launch_gluon_attention,
    )

    config = (128, 128, 2, 1, 1, DYNAMIC)
    q, k, v = make_qkv(b, h, h, t, t, d, torch.bfloat16)
    out = poisoned((b, h, t, d), torch.bfloat16)
    (programs,), args, meta = gluon_attention_args(q, k, v, out, True, d**-0.5, config=config)
    n_tiles = b * h * -(-t // 128)
    if programs >= n_tiles:
        raise Skip(f"{n_tiles} tiles on {programs} programs: no tile comes from the counter")
    counter = _tile_counter(q.device)
    counter.fill_(n_tiles - programs)
    launch_gluon_attention(q, k, v, out, True, d**-0.5, config=config)
    torch.cuda.synchronize()
    rows_written = int((~out.isnan().any(-1)).sum())  # a tile is 128 rows of one (batch, head)
    left = counter.item()
    return [
        Outcome(
            "only the first lap's tiles written",
            rows_written == programs * 128,
            note=f"{rows_written} rows written, {programs} tiles of 128 expected",
        ),
        Outcome("the counter is back at zero", left == 0, note=f"{left}"),
    ]


def check_gluon_graph(b, h, hkv, t, d, causal):
    """flash_attention on the Gluon path captured in a CUDA graph and replayed on new inputs
    copied into the captured ones, into a poisoned output each time, with an eager call of the
    same op between the replays: O against the reference after each replay and after the eager
    call (a DYNAMIC row's counter under capture is the graph's own, zeroed as it replays; the
    eager calls use the stream's). More tiles than SMs, so tiles come from the counter."""
    if not gluon_runs_here():
        raise Skip(f"the Gluon forward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}")
    scale = 1.0 / math.sqrt(d)
    q, k, v = make_qkv(b, h, hkv, t, t, d, torch.bfloat16)
    out = poisoned((b, h, t, d), torch.bfloat16)
    with forced_path("gluon"):
        outcomes = [Outcome("the Gluon forward runs", gluon_forward(q, k, v, causal, out, None, None, None))]
        flash_attention(q, k, v, causal=causal, out=out)  # compiled before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            flash_attention(q, k, v, causal=causal, out=out)
        for replay in range(2):
            for buf, new in zip((q, k, v), make_qkv(b, h, hkv, t, t, d, torch.bfloat16)):
                buf.copy_(new)
            out.copy_(poisoned(out.shape, out.dtype))
            graph.replay()
            torch.cuda.synchronize()
            outcomes.append(
                dataclasses.replace(compare_o(out, q, k, v, causal, scale, None, None), check=f"O, replay {replay + 1}")
            )
            eager = flash_attention(q, k, v, causal=causal)
            outcomes.append(
                dataclasses.replace(
                    compare_o(eager, q, k, v, causal, scale, None, None),
                    check=f"O, eager call after replay {replay + 1}",
                )
            )
    return outcomes


def check_gluon_varlen_grid(grid, lengths_q, lengths_k, h, hkv, d, causal, window=None, tail=0):
    """A packed batch launched on `grid` (the table's config otherwise) into poisoned O and LSE,
    twice (a dynamic grid's counter must start at zero again): each sequence's O and LSE equal
    the same config's dense launch on that sequence bit for bit (the same blocks in the same
    order), zeros and -inf where a sequence has no keys; no row left unwritten; a dynamic grid's
    counter back at zero. Many sequences take the tile search (_tile_of) many steps, and lengths
    of 0, 1, BLOCK_M and its multiples land on its edges. tail: q and O hold that many rows past
    cu_seqlens_q[-1], which keep their poison (the tiles past the end write nothing)."""
    if not gluon_runs_here():
        raise Skip(f"the Gluon forward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}")
    from llmk.attention.flash_attention_ops import packed
    from llmk.attention.gluon_flash_attention_fwd import DYNAMIC, _tile_counter, gluon_config, launch_gluon_attention

    dtype, scale = torch.bfloat16, 1.0 / math.sqrt(d)
    mask = attention_mask(window, None)
    config = (*gluon_config(d, causal and window is None)[:5], grid)
    q, k, v = (
        rand((sum(lengths_q) + tail, h, d), dtype),
        rand((sum(lengths_k), hkv, d), dtype),
        rand((sum(lengths_k), hkv, d), dtype),
    )
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    for _ in range(2):
        out, lse = poisoned(q.shape, dtype), poisoned((h, q.shape[0]), torch.float32)
        launch_gluon_attention(
            packed(q),
            packed(k),
            packed(v),
            packed(out),
            causal,
            scale,
            packed(lse),
            mask,
            config,
            cu_seqlens=(cu_q, cu_k, max(lengths_q)),
        )
    want_o, want_lse = torch.zeros_like(out), torch.full_like(lse, float("-inf"))
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(lengths_q)):
        sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if lengths_q[i] and lengths_k[i]:
            one = [t[s].transpose(0, 1).unsqueeze(0) for t, s in ((q, sq), (k, sk), (v, sk))]
            o_i, lse_i = torch.empty_like(one[0]), torch.empty(one[0].shape[:3], dtype=torch.float32, device=DEVICE)
            launch_gluon_attention(*one, o_i, causal, scale, lse_i, mask, config[:5] + (0,))
            want_o[sq], want_lse[:, sq] = o_i[0].transpose(0, 1), lse_i[0]
    end = cq[-1]
    outcomes = [
        compare("O against the dense launches", out[:end], want_o[:end], EXACT),
        compare("LSE against the dense launches", lse[:, :end], want_lse[:, :end], EXACT),
    ]
    if tail:
        outcomes.append(
            Outcome(
                f"the {tail} rows past cu_seqlens_q[-1] keep their poison",
                bool(out[end:].isnan().all() and lse[:, end:].isnan().all()),
            )
        )
    if grid == DYNAMIC:
        left = _tile_counter(q.device).item()
        outcomes.append(Outcome("the tile counter is zero after the launch", left == 0, note=f"{left}"))
    return outcomes


def gluon_config_cases():
    """check_gluon_config on the configs the A/B weighs (GPU only): the hard cases on both
    persistent grids, STATIC and DYNAMIC (more tiles than the H200's 132 SMs, so the dynamic deal
    takes tiles from its counter), and one tile a program."""
    bf16 = torch.bfloat16
    hard = [  # (name, config without its GRID, shape)
        (
            "hd128 128x128x2 split, causal Tq1000 Tk300: tiles with no keys",
            (128, 128, 2, 1, 1),
            dict(b=2, h=32, hkv=8, tq=1000, tk=300, d=128, causal=True),
        ),
        (
            "hd64 128x128x3, full B4 H16 T1000: 8 key blocks over 3 stages",
            (128, 128, 3, 1, 0),
            dict(b=4, h=16, hkv=4, tq=1000, tk=1000, d=64, causal=False),
        ),
        (
            "hd64 128x128x3, causal B8 H16 T2048: many tiles a program",
            (128, 128, 3, 1, 0),
            dict(b=8, h=16, hkv=4, tq=2048, tk=2048, d=64, causal=True),
        ),
        (
            "hd128 lockstep 128x64x2, window (256, 0) B4 H16 T777",
            (128, 64, 2, 0, 0),
            dict(b=4, h=16, hkv=4, tq=777, tk=777, d=128, causal=True, window=(256, 0)),
        ),
        (
            "hd128 128x128x2 split, causal softcap B8 H16 T2048: many tiles a program",
            (128, 128, 2, 1, 1),
            dict(b=8, h=16, hkv=4, tq=2048, tk=2048, d=128, causal=True, softcap=30.0),
        ),
        (
            "hd128 128x128x2 split, causal GQA 6/3 B3 Tq1000 Tk16384: L2 groups of 8, 8, 2 pairs",
            (128, 128, 2, 1, 1),
            dict(b=3, h=6, hkv=3, tq=1000, tk=16384, d=128, causal=True),
        ),
        (
            "hd128 128x128x2 split, full B1 H2 T100: fewer tiles than SMs",
            (128, 128, 2, 1, 1),
            dict(b=1, h=2, hkv=1, tq=100, tk=100, d=128, causal=False),
        ),
    ]
    rows = [
        (f"{grid_name} {name}", (*config, grid), kw)
        for grid_name, grid in (("persistent", 1), ("dynamic", 2))
        for name, config, kw in hard
    ]
    rows.append(
        (
            "hd128 128x128x2 split (one tile a program), causal T1000",
            (128, 128, 2, 1, 1, 0),
            dict(b=2, h=8, hkv=8, tq=1000, tk=1000, d=128, causal=True),
        )
    )
    cases = [
        Case(f"Gluon config: {name}", check_gluon_config, dict(kw, config=config, dtype=bf16), gpu_only=True)
        for name, config, kw in rows
    ]
    # packed batches on each grid: 150 sequences (8 steps of the tile search), lengths on BLOCK_M's edges
    gen = torch.Generator().manual_seed(1)
    many = [int(n) for n in torch.randint(0, 400, (150,), generator=gen)]
    many[:8] = [0, 1, 127, 128, 129, 256, 0, 383]
    packed = [
        (
            "150 sequences 0..400 GQA 8/2 hd128 causal",
            dict(lengths_q=many, lengths_k=many, h=8, hkv=2, d=128, causal=True),
        ),
        (
            "150 sequences 0..400 GQA 8/2 hd64 full",
            dict(lengths_q=many, lengths_k=many, h=8, hkv=2, d=64, causal=False),
        ),
        (
            "Tq != Tk [128,0,1,300,256] vs [50,7,0,900,256] hd128 causal",
            dict(lengths_q=[128, 0, 1, 300, 256], lengths_k=[50, 7, 0, 900, 256], h=4, hkv=4, d=128, causal=True),
        ),
        (
            "[1000,3,2000] hd128 window (256, 0)",
            dict(lengths_q=[1000, 3, 2000], lengths_k=[1000, 3, 2000], h=4, hkv=1, d=128, causal=True, window=(256, 0)),
        ),
        (
            "[300,77] and 700 rows past cu_seqlens_q[-1], hd64 causal",
            dict(lengths_q=[300, 77], lengths_k=[300, 77], h=4, hkv=2, d=64, causal=True, tail=700),
        ),
    ]
    return cases + [
        Case(f"Gluon packed grid {grid_name}: {name}", check_gluon_varlen_grid, dict(kw, grid=grid), gpu_only=True)
        for grid_name, grid in (("one tile a program", 0), ("static", 1), ("dynamic", 2))
        for name, kw in packed
    ]


def check_gluon_backward(
    b, h, hkv, tq, tk, d, dtype, causal, layout="bhtd", scale=1.0, kernels=("dkdv", "dq"), window=None, softcap=None
):
    """The backward with `kernels` in Gluon (launch_flash_attention_backward's gluon: the two-pass
    schedule's, the tl kernel for the other) into poisoned buffers, under the tl backward's
    tolerances (the 2x rule and delta's rounding); scale multiplies q; window and softcap the
    mask's. Then a call they do not take raises: a head dim of 96."""
    outcomes = check_backward_forced(
        None,
        b,
        h,
        hkv,
        tq,
        tk,
        d,
        dtype,
        causal,
        scale=scale,
        layout=layout,
        gluon=kernels,
        window=window,
        softcap=softcap,
    )
    q96 = rand((1, 2, 16, 96), dtype)
    outcomes.append(
        expect_raises(
            "Gluon backward at head dim 96: ValueError",
            lambda: launch_flash_attention_backward(
                q96,
                q96,
                q96,
                q96,
                q96,
                torch.zeros(1, 2, 16, device=DEVICE),
                *(torch.empty_like(q96) for _ in range(3)),
                False,
                0.1,
                gluon=kernels,
            ),
            ValueError,
            "gluon",
        )
    )
    return outcomes


def check_gluon_varlen_backward(
    lengths_q, lengths_k, h, hkv, d, dtype, causal, window=None, softcap=None, tail=0, scale=1.0
):
    """A packed batch's backward on both Gluon kernels into poisoned dq, dk, dv: each sequence's
    gradients equal the same kernels' dense backward on that sequence bit for bit (the same blocks
    in the same order; the rows a block reads past its sequence's end, the next sequence's, add
    nothing, as the zeros a dense call reads), zeros where a sequence has no keys or no queries.
    Many sequences take the block search (packed_sequence) many steps, and lengths of 0, 1, 64,
    128 and their neighbours land on both kernels' block edges. tail: q, k and v hold that many
    rows past the last sequence, whose gradients keep their poison. scale multiplies q."""
    if not gluon_runs_here():
        raise Skip(f"the Gluon backward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}")
    sm_scale, mask = 1.0 / math.sqrt(d), attention_mask(window, softcap)
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    varlen = (cu_q, cu_k, max(lengths_q), max(lengths_k))
    do, q, k, v, o, lse = packed_backward_inputs(varlen, h, hkv, d, dtype, causal, mask, tail, scale)
    grads = [poisoned(t.shape, dtype) for t in (q, k, v)]
    launch_flash_attention_backward(
        *(packed(t) for t in (do, q, k, v, o, lse, *grads)),
        causal,
        sm_scale,
        cu_seqlens=varlen,
        mask=mask,
        gluon=("dkdv", "dq"),
    )
    want = [torch.zeros_like(t) for t in grads]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(lengths_q)):
        sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if lengths_q[i] and lengths_k[i]:
            one = [t[s].transpose(0, 1).unsqueeze(0) for t, s in ((do, sq), (q, sq), (k, sk), (v, sk), (o, sq))]
            got = [torch.empty_like(t) for t in one[1:4]]
            launch_flash_attention_backward(
                *one, lse[:, sq].unsqueeze(0), *got, causal, sm_scale, mask=mask, gluon=("dkdv", "dq")
            )
            for w, g, s in zip(want, got, (sq, sk, sk)):
                w[s] = g[0].transpose(0, 1)
    ends = (cq[-1], ck[-1], ck[-1])
    outcomes = [
        compare(f"{name} against the dense launches", g[:end], w[:end], EXACT)
        for name, g, w, end in zip(("dq", "dk", "dv"), grads, want, ends)
    ]
    if tail:
        outcomes.append(
            Outcome(
                f"the {tail} rows past the last sequence keep their poison",
                all(bool(g[end:].isnan().all()) for g, end in zip(grads, ends)),
            )
        )
    return outcomes


def packed_backward_inputs(varlen, h, hkv, d, dtype, causal, mask, tail=0, scale=1.0):
    """(dO, q, k, v, O, LSE) of a packed batch: random (total + tail, heads, D) tensors (q times
    scale), O and LSE from the forward (so that P is a softmax)."""
    total_q, total_k = int(varlen[0][-1]) + tail, int(varlen[1][-1]) + tail
    q = rand((total_q, h, d), dtype, scale=scale)
    k, v = rand((total_k, hkv, d), dtype), rand((total_k, hkv, d), dtype)
    with torch.no_grad():
        o, lse = flash_attention_varlen_train_op(
            q, k, v, *varlen, causal, 1.0 / math.sqrt(d), None, False, mask.window_left, mask.window_right, mask.softcap
        )
    return rand(q.shape, dtype), q, k, v, o, lse


def check_gluon_varlen_backward_graph(lengths, h, hkv, d, causal):
    """A packed batch's Gluon backward (packed_stats' device ops, both kernels) captured in a CUDA
    graph and replayed on new inputs copied into the captured ones, into poisoned gradients: each
    replay's dq, dk, dv equal an eager call's on the same inputs bit for bit."""
    if not gluon_runs_here():
        raise Skip(f"the Gluon backward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}")
    mask, sm_scale = attention_mask(None, None), 1.0 / math.sqrt(d)
    cu = cumulative(lengths)
    varlen = (cu, cu, max(lengths), max(lengths))
    inputs = packed_backward_inputs(varlen, h, hkv, d, torch.bfloat16, causal, mask)
    grads = [poisoned(t.shape, t.dtype) for t in inputs[1:4]]

    def backward(into):
        launch_flash_attention_backward(
            *(packed(t) for t in (*inputs, *into)), causal, sm_scale, cu_seqlens=varlen, mask=mask, gluon=("dkdv", "dq")
        )

    backward(grads)  # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backward(grads)
    outcomes = []
    for replay in range(2):
        for buf, new in zip(inputs, packed_backward_inputs(varlen, h, hkv, d, torch.bfloat16, causal, mask)):
            buf.copy_(new)
        for g in grads:
            g.copy_(poisoned(g.shape, g.dtype))
        graph.replay()
        torch.cuda.synchronize()
        eager = [torch.empty_like(g) for g in grads]
        backward(eager)
        outcomes += [
            compare(f"{name}, replay {replay + 1}, against an eager call", g, e, EXACT)
            for name, g, e in zip(("dq", "dk", "dv"), grads, eager)
        ]
    return outcomes


def check_row_groups(b, h, hkv, t, d, rows):
    """The Gluon backward of a dense causal batch with its grids dealt in groups of `rows` (batch,
    head) rows (CAUSAL_ROW_GROUP; the last group short where rows does not divide them), into
    poisoned dq, dk, dv: equal bit for bit to the launch order's (a program's work does not depend on
    when it runs), so every program ran once."""
    if not gluon_runs_here():
        raise Skip(f"the Gluon backward runs on sm_90 with Triton {GLUON_TRITON_VERSIONS}")
    from llmk.attention import gluon_flash_attention_bwd as gluon_bwd

    q = rand((b, h, t, d), torch.bfloat16)
    k, v = rand((b, hkv, t, d), torch.bfloat16), rand((b, hkv, t, d), torch.bfloat16)
    with torch.no_grad():
        o, lse = flash_attention_train_op(q, k, v, True, None, None)
    do = rand(q.shape, q.dtype)

    def backward(group):
        grads = [poisoned(x.shape, x.dtype) for x in (q, k, v)]
        with table_entry(vars(gluon_bwd), "CAUSAL_ROW_GROUP", group):  # read at each launch
            launch_flash_attention_backward(do, q, k, v, o, lse, *grads, True, 1.0 / math.sqrt(d), gluon=("dkdv", "dq"))
        return grads

    launch_order, grouped = backward(0), backward(rows)
    return [
        compare(f"{name} in groups of {rows} rows against the launch order", g, want, EXACT)
        for name, g, want in zip(("dq", "dk", "dv"), grouped, launch_order)
    ]


def check_packed_stats():
    """packed_stats (torch ops, so every lane runs it): each sequence's LSE and delta at its place,
    (cu_seqlens[i] // 128 + i) * 128, LSE +inf and delta 0 from its end to the next place, with
    empty sequences, lengths on 128's edges, and tokens past the last sequence (not placed)."""
    try:
        from llmk.attention.gluon_flash_attention_bwd import PACKED_STATS_BLOCK, packed_stats
    except ImportError as e:  # a Triton whose Gluon API moved: the GPU lane's Triton has it
        raise Skip(f"the Gluon backward's module does not import here: {e}") from e
    lengths = [3, 0, 128, 1, 255, 129, 40]
    cu = cumulative(lengths)
    total = sum(lengths) + 5  # 5 tokens past the last sequence
    lse, delta = rand((1, 3, total), torch.float32), rand((1, 3, total), torch.float32)
    got_lse, got_delta = packed_stats(lse, delta, cu)
    span = (total // PACKED_STATS_BLOCK + len(lengths)) * PACKED_STATS_BLOCK
    want_lse = torch.full((1, 3, span), float("inf"), device=DEVICE)
    want_delta = torch.zeros((1, 3, span), device=DEVICE)
    starts = cu.tolist()
    for i, n in enumerate(lengths):
        place = (starts[i] // PACKED_STATS_BLOCK + i) * PACKED_STATS_BLOCK
        want_lse[..., place : place + n] = lse[..., starts[i] : starts[i] + n]
        want_delta[..., place : place + n] = delta[..., starts[i] : starts[i] + n]
    return [
        Outcome(
            "shape: (1, H, (total // 128 + sequences) * 128)",
            tuple(got_lse.shape) == (1, 3, span),
            note=f"{tuple(got_lse.shape)}",
        ),
        compare("LSE at the sequences' places", got_lse, want_lse, EXACT),
        compare("delta at the sequences' places", got_delta, want_delta, EXACT),
    ]


def gluon_varlen_backward_cases():
    """check_gluon_varlen_backward (GPU only): many sequences on both head dims, Tq != Tk with
    empty sequences, a window on each head dim, a softcap, fp16,
    rows past the last sequence."""
    bf16, fp16 = torch.bfloat16, torch.float16
    gen = torch.Generator().manual_seed(2)
    many = [int(n) for n in torch.randint(0, 400, (100,), generator=gen)]
    many[:10] = [0, 1, 63, 64, 65, 127, 128, 129, 0, 383]
    shapes = [
        (
            "100 sequences 0..400 GQA 8/2 hd128 causal",
            dict(lengths_q=many, lengths_k=many, h=8, hkv=2, d=128, dtype=bf16, causal=True),
        ),
        (
            "100 sequences 0..400 GQA 8/2 hd64 full",
            dict(lengths_q=many, lengths_k=many, h=8, hkv=2, d=64, dtype=bf16, causal=False),
        ),
        (
            "Tq != Tk [128,0,1,300,256] vs [50,7,0,900,256] hd128 causal fp16",
            dict(
                lengths_q=[128, 0, 1, 300, 256],
                lengths_k=[50, 7, 0, 900, 256],
                h=4,
                hkv=4,
                d=128,
                dtype=fp16,
                causal=True,
            ),
        ),
        (
            "[1000,3,2000] hd128 window (256, 0)",
            dict(
                lengths_q=[1000, 3, 2000],
                lengths_k=[1000, 3, 2000],
                h=4,
                hkv=1,
                d=128,
                dtype=bf16,
                causal=True,
                window=(256, 0),
            ),
        ),
        (
            "[700,65,1500] hd64 window (100, 0)",
            dict(
                lengths_q=[700, 65, 1500],
                lengths_k=[700, 65, 1500],
                h=4,
                hkv=2,
                d=64,
                dtype=bf16,
                causal=True,
                window=(100, 0),
            ),
        ),
        (
            "[513,77,1000] hd128 causal softcap 50, q x 30",
            dict(
                lengths_q=[513, 77, 1000],
                lengths_k=[513, 77, 1000],
                h=4,
                hkv=2,
                d=128,
                dtype=bf16,
                causal=True,
                softcap=50.0,
                scale=30.0,
            ),
        ),
        (
            "[300,77] and 700 rows past the last sequence, hd64 causal",
            dict(lengths_q=[300, 77], lengths_k=[300, 77], h=4, hkv=2, d=64, dtype=bf16, causal=True, tail=700),
        ),
    ]
    return (
        [Case(f"Gluon packed backward: {name}", check_gluon_varlen_backward, kw, gpu_only=True) for name, kw in shapes]
        + [Case("Gluon packed backward: packed_stats' places", check_packed_stats)]
        + [
            Case(
                f"Gluon packed backward: CUDA graph, hd{d} causal [700,1,300,1000] GQA 8/2",
                check_gluon_varlen_backward_graph,
                dict(lengths=[700, 1, 300, 1000], h=8, hkv=2, d=d, causal=True),
                gpu_only=True,
            )
            for d in GLUON_HEAD_DIMS
        ]
    )


def gluon_backward_cases():
    """check_gluon_backward (GPU only), both kernels in Gluon: ragged lengths, GQA and MHA,
    bottom-right causal both ways (Tq > Tk leaves rows that see no key), one query, a (B, T, H, D)
    layout, a long causal batch, flash-attn's overflow inputs (q x 5, fp16, two queries); each
    kernel beside the tl one for the other; windows and softcaps."""
    bf16, fp16 = torch.bfloat16, torch.float16
    shapes = [
        ("hd128 B2 H8/2 T1000 full", dict(b=2, h=8, hkv=2, tq=1000, tk=1000, d=128, dtype=bf16, causal=False)),
        ("hd128 B2 H8/2 T1000 causal", dict(b=2, h=8, hkv=2, tq=1000, tk=1000, d=128, dtype=bf16, causal=True)),
        (
            "hd128 fp16 B1 H4/4 Tq300 Tk700 causal",
            dict(b=1, h=4, hkv=4, tq=300, tk=700, d=128, dtype=fp16, causal=True),
        ),
        ("hd64 B2 H4/1 Tq700 Tk300 causal", dict(b=2, h=4, hkv=1, tq=700, tk=300, d=64, dtype=bf16, causal=True)),
        ("hd64 fp16 B3 H2/2 T1 full", dict(b=3, h=2, hkv=2, tq=1, tk=1, d=64, dtype=fp16, causal=False)),
        (
            "hd64 B2 H4/2 T257 causal, (B, T, H, D)",
            dict(b=2, h=4, hkv=2, tq=257, tk=257, d=64, dtype=bf16, causal=True, layout="bthd"),
        ),
        ("hd128 B1 H16/4 T4096 causal", dict(b=1, h=16, hkv=4, tq=4096, tk=4096, d=128, dtype=bf16, causal=True)),
        (
            "hd64 fp16 B2 H2/2 Tq2 Tk2 full, q x 5",
            dict(b=2, h=2, hkv=2, tq=2, tk=2, d=64, dtype=fp16, causal=False, scale=5.0),
        ),
        (
            "dk/dv only: hd128 B2 H8/2 T1000 causal",
            dict(b=2, h=8, hkv=2, tq=1000, tk=1000, d=128, dtype=bf16, causal=True, kernels=("dkdv",)),
        ),
        (
            "dq only: hd64 B2 H4/2 Tq700 Tk300 causal",
            dict(b=2, h=4, hkv=2, tq=700, tk=300, d=64, dtype=bf16, causal=True, kernels=("dq",)),
        ),
        # the masks: Mistral's window, a window bounded on both sides whose first queries see no
        # key, Gemma 2's softcap on scaled-up scores, both
        (
            "window (1024, 0) causal hd128 B1 H16/4 T3000",
            dict(b=1, h=16, hkv=4, tq=3000, tk=3000, d=128, dtype=bf16, causal=True, window=(1024, 0)),
        ),
        (
            "window (40, 3) hd64 fp16 B1 H2/2 Tq90 Tk60 (no key for 27 queries)",
            dict(b=1, h=2, hkv=2, tq=90, tk=60, d=64, dtype=fp16, causal=False, window=(40, 3)),
        ),
        (
            "softcap 50: q x 30 causal hd128 B2 H8/4 T1000",
            dict(b=2, h=8, hkv=4, tq=1000, tk=1000, d=128, dtype=bf16, causal=True, softcap=50.0, scale=30.0),
        ),
        (
            "softcap 5: q x 5 hd64 fp16 B2 H4/2 T333",
            dict(b=2, h=4, hkv=2, tq=333, tk=333, d=64, dtype=fp16, causal=False, softcap=5.0, scale=5.0),
        ),
        (
            "window (255, 0) causal softcap 50: q x 30 hd128 Tq1000 Tk4097",
            dict(
                b=1,
                h=4,
                hkv=2,
                tq=1000,
                tk=4097,
                d=128,
                dtype=bf16,
                causal=True,
                window=(255, 0),
                softcap=50.0,
                scale=30.0,
            ),
        ),
    ]
    return [Case(f"Gluon backward: {name}", check_gluon_backward, kw, gpu_only=True) for name, kw in shapes] + [
        # dk/dv rows 3 x 2 = 6, dq rows 24: groups of 4 leave a short last group of dk/dv rows, of 5 of both
        Case(
            f"Gluon backward: causal grids dealt in groups of {rows} rows, hd{d} B3 H8/2 T1000",
            check_row_groups,
            dict(b=3, h=8, hkv=2, t=1000, d=d, rows=rows),
            gpu_only=True,
        )
        for d, rows in ((64, 4), (128, 5))
    ]


CASES = (
    gluon_forward_cases()
    + varlen_gluon_cases()
    + gluon_config_cases()
    + gluon_backward_cases()
    + gluon_varlen_backward_cases()
    + [
        Case(
            f"CUDA graph of the Gluon path: hd{d} {'causal' if causal else 'full'} B2 H16/4 T2048",
            check_gluon_graph,
            dict(b=2, h=16, hkv=4, t=2048, d=d, causal=causal),
            gpu_only=True,
        )
        for d in GLUON_HEAD_DIMS
        for causal in (False, True)
    ]
    + [
        Case(
            "Gluon config: the dynamic deal reads its counter (set to n_tiles - P: one lap written) B2 H16 T2048",
            check_dynamic_counter,
            dict(b=2, h=16, t=2048, d=128),
            gpu_only=True,
        )
    ]
    + [Case("forward kernel dispatch (Gluon or tl)", check_gluon_dispatch)]
)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("gluon attention", CASES)
