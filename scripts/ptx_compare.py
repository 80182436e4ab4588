"""Whether a change to kernel code changes the code the GPU runs, without a GPU: compile the
kernels of the working tree and of a git revision for sm_90 (Triton's own compiler and ptxas,
which run on any machine) and compare their PTX, less debug lines and comments. Identical PTX is
identical SASS, so a refactor that keeps it needs no GPU timing to show it costs nothing.

    python scripts/ptx_compare.py HEAD                  (every case set; a few minutes on 2 cores)
    python scripts/ptx_compare.py HEAD~3 attention      (one case set: attention, decode, norm, fp8, moe)

Each tree runs in its own process, imported as the package `llmk` from its folder. The cases are
this file's: real launchers called on CPU tensors with Triton's launch replaced by a recorder,
each recorded launch bound and specialized as a launch would be, then compiled. A case whose
launcher differs between the trees fails on one side and is reported, not compared. Prints one
line a kernel, IDENTICAL or DIFFERENT (with both line counts), and exits 1 if any differs.
"""

import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETS = ("attention", "decode", "norm", "fp8", "moe")


def normalized_ptx(text):
    """PTX lines without the DWARF sections, .loc / .file lines, debug labels and comments."""
    text = re.split(r"^\s*\.section\s+\.debug", text, flags=re.M)[0]
    out = []
    for line in text.splitlines():
        s = line.strip()
        debug_label = re.match(r"^\$L__(tmp|func_begin|func_end|info_string)\d*:$", s)
        if not s or s.startswith(("//", ".loc", ".file")) or debug_label:
            continue
        out.append(re.sub(r"\s*//.*$", "", s))
    return out


# ---------------------------------------------------------------------------------------------
# compile mode: python scripts/ptx_compare.py --compile TREE OUTDIR SET


def _load_tree(tree):
    os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU target even on a machine without one
    spec = importlib.util.spec_from_file_location(
        "llmk", os.path.join(tree, "__init__.py"), submodule_search_locations=[tree]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["llmk"] = module
    spec.loader.exec_module(module)


def _compile_cases(tree, out_dir, case_set):
    _load_tree(tree)
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    captured = []
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: captured.append((self, args, kwargs))
    try:  # the direct launches (common/direct_launch.py) through kernel[grid], so they are recorded too
        from llmk.common.direct_launch import Launcher

        Launcher.launch = lambda self, grid, args, keywords: self.kernel[grid](*args, **keywords)
    except ImportError:  # a revision from before it
        pass

    def compile_launches(case, launch):
        captured.clear()
        launch()
        seen = {}
        for fn, args, kwargs in captured:
            kwargs = dict(kwargs)  # as JITFunction.run completes them
            kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
            kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
            if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
                kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, specialization, opts = binder(*args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, opts)
            compiled = triton.compile(
                ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
            )
            name = f"{case}__{fn.__name__}"
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:  # a second launch of the kernel in one case: its own file
                name += f"_{seen[name]}"
            pathlib.Path(out_dir, name + ".ptx").write_text(compiled.asm["ptx"])
            print(name, flush=True)

    empty, bf16, f16 = torch.empty, torch.bfloat16, torch.float16
    cases = []
    if case_set == "attention":
        import llmk.attention.triton_flash_attention_bwd as bwd
        import llmk.attention.triton_flash_attention_fwd as fwd

        def mask_options(launcher, window, softcap):
            """The launcher's mask keywords: mask= (an AttentionMask) since the launchers took one,
            window= and softcap= before (a revision from before then compares too)."""
            if "mask" in inspect.signature(launcher).parameters:
                from llmk.attention.attention_checks import attention_mask

                return dict(mask=attention_mask(window, softcap or None))
            return dict(window=window, softcap=softcap)

        def packed(varlen, n):  # (cu_q, cu_k, max lengths...) of two sequences in 1024 tokens
            return (torch.tensor([0, 300, 1024], dtype=torch.int32),) * 2 + (724,) * n if varlen else None

        def forward(d, causal, window, softcap, varlen, window_split=True):
            b, h, hkv, t = (1 if varlen else 2), 8, 2, 1024
            q, out = empty(b, h, t, d, dtype=bf16), empty(b, h, t, d, dtype=bf16)
            k, v = empty(b, hkv, t, d, dtype=bf16), empty(b, hkv, t, d, dtype=bf16)
            fwd.launch_flash_attention(
                q,
                k,
                v,
                out,
                causal,
                0.125,
                lse=empty(b, h, t),
                cu_seqlens=packed(varlen, 1),
                window_split=window_split,
                **mask_options(fwd.launch_flash_attention, window, softcap),
            )

        def backward(d, causal, window, softcap, varlen, deterministic, tma):
            b, h, hkv, t = (1 if varlen else 2), 8, 2, 1024
            q, do, o, dq = (empty(b, h, t, d, dtype=bf16) for _ in range(4))
            k, v, dk, dv = (empty(b, hkv, t, d, dtype=bf16) for _ in range(4))
            bwd.tma_reduce_available = lambda device: tma
            bwd.launch_flash_attention_backward(
                do,
                q,
                k,
                v,
                o,
                empty(b, h, t),
                dq,
                dk,
                dv,
                causal,
                0.125,
                cu_seqlens=packed(varlen, 2),
                deterministic=deterministic,
                **mask_options(bwd.launch_flash_attention_backward, window, softcap),
            )

        plain, w127, w64 = (-1, -1), (127, 0), (64, 32)
        cases += [
            (f"fwd_hd{d}_{name}", lambda d=d, a=a: forward(d, *a))
            for d, name, a in (
                (128, "full", (False, plain, 0.0, False)),
                (128, "causal", (True, plain, 0.0, False)),
                (128, "causal_softcap_packed", (True, plain, 30.0, True)),
                (128, "window", (False, w127, 0.0, False)),
                (128, "causal_window_softcap_packed", (True, w127, 30.0, True)),
                (128, "window_2side", (False, w64, 0.0, False)),
                (128, "window_one_loop", (False, w127, 0.0, False, False)),
                (64, "causal", (True, plain, 0.0, False)),
                (64, "window_softcap_packed", (False, w64, 30.0, True)),
            )
        ]
        cases += [
            (f"bwd_hd{d}_{name}", lambda d=d, a=a: backward(d, *a))
            for d, name, a in (
                (128, "causal_two_pass", (True, plain, 0.0, False, True, False)),
                (128, "causal_atomic", (True, plain, 0.0, False, False, False)),
                (128, "causal_tma", (True, plain, 0.0, False, False, True)),
                (128, "full_two_pass", (False, plain, 0.0, False, True, False)),
                (128, "causal_window_softcap_packed", (True, w127, 30.0, True, True, False)),
                (128, "causal_window_softcap_packed_tma", (True, w127, 30.0, True, False, True)),
                (128, "window_2side", (False, w64, 0.0, False, True, False)),
                (64, "causal_two_pass", (True, plain, 0.0, False, True, False)),
            )
        ]
    elif case_set == "decode":
        import llmk.inference.triton_inference_attention as ia

        ia.sm_count = lambda *args: 132  # an H100's or H200's

        def decode(b, h, hkv, t, d, splits):
            q, lengths = empty(b, h, d, dtype=f16), empty(b, dtype=torch.int32)
            k, v = empty(b, t, hkv, d, dtype=f16), empty(b, t, hkv, d, dtype=f16)
            ia._launch(q, k, v, lengths, None, 1, t, None, None, splits, t)

        cases += [
            (f"decode_hd{d}_B{b}_H{h}_{hkv}_T{t}", lambda a=(b, h, hkv, t, d, s): decode(*a))
            for d in (64, 80, 96, 128, 256)
            for b, h, hkv, t, s in ((16, 32, 32, 4096, 1), (1, 32, 8, 8192, None), (4, 32, 1, 4096, 1))
        ]
    elif case_set == "norm":
        import llmk.common.reduce as reduce
        import llmk.normalization.launch_config as launch_config
        from llmk.normalization.triton_norm_backward import launch_rmsnorm_backward

        launch_config.sm_count = reduce.sm_count = lambda *args: 132  # an H100's or H200's
        from llmk.normalization.triton_rmsnorm import launch_rmsnorm

        def norm_forward(m, n, residual):
            x, w, y = empty(m, n, dtype=bf16), empty(n, dtype=bf16), empty(m, n, dtype=bf16)
            r, u = (empty(m, n, dtype=bf16), empty(m, n, dtype=bf16)) if residual else (None, None)
            launch_rmsnorm(x, r, w, 1e-6, y, u)

        def norm_backward(m, n, du):
            x, dy, dx = (empty(m, n, dtype=bf16) for _ in range(3))
            w = empty(n, dtype=bf16)
            launch_rmsnorm_backward(dy, x, w, empty(m, n, dtype=bf16) if du else None, 1e-6, dx, empty(n, dtype=bf16))

        cases += [
            (f"rmsnorm_fwd_N{n}{'_residual' if r else ''}", lambda n=n, r=r: norm_forward(4096, n, r))
            for n in (1024, 4096, 8192)
            for r in (False, True)
        ]
        cases += [
            (f"rmsnorm_bwd_N{n}{'_du' if du else ''}", lambda n=n, du=du: norm_backward(4096, n, du))
            for n in (4096, 16384)
            for du in (False, True)
        ]
    elif case_set == "fp8":
        import llmk.inference.triton_inference_attention as ia
        from llmk.gemm.triton_fp8_producers import launch_glu_fp8, launch_rmsnorm_fp8
        from llmk.gemm.triton_fp8_quant import launch_quantize_fp8

        ia.sm_count = lambda *args: 132
        e4m3 = torch.float8_e4m3fn

        def decode_e4m3(b, hkv, t, d, splits, paged):
            q, lengths = empty(b, 32, d, dtype=bf16), empty(b, dtype=torch.int32)
            shape = (b * t // 16, 16, hkv, d) if paged else (b, t, hkv, d)
            k = empty(shape, dtype=e4m3)
            try:  # v token-minor, as the caches store an e4m3 v
                import llmk.inference.paged_kv_cache as pkv
                from llmk.inference.kv_cache import TOKEN_ALIGN, token_minor

                # (PAGE_ALIGN came after token_minor, at 1)
                v = token_minor(shape, e4m3, "cpu", getattr(pkv, "PAGE_ALIGN", 1) if paged else TOKEN_ALIGN)
            except ImportError:  # a revision from before it
                v = empty(shape, dtype=e4m3)
            ks, vs = empty(shape[:3]), empty(shape[:3])
            table = empty(b, t // 16, dtype=torch.int32) if paged else None
            ia._launch(q, k, v, lengths, table, 16 if paged else 1, t, None, None, splits, t, k_scale=ks, v_scale=vs)

        def rmsnorm_e4m3(m, n, residual):
            x, w = empty(m, n, dtype=bf16), empty(n, dtype=bf16)
            r = empty(m, n, dtype=bf16) if residual else None
            u = empty(m, n, dtype=bf16) if residual else None
            launch_rmsnorm_fp8(x, r, w, 1e-6, 0.0, empty(m, n, dtype=e4m3), empty(m), None, u)

        def glu_e4m3(m, n):
            launch_glu_fp8(empty(m, n, dtype=bf16), empty(m, n, dtype=bf16), "silu", empty(m, n, dtype=e4m3), empty(m))

        cases += [
            (
                f"decode_e4m3_hd{d}_B{b}_{hkv}_T{t}{'_paged' if p else ''}",
                lambda a=(b, hkv, t, d, s, p): decode_e4m3(*a),
            )
            for d in (96, 128)
            for b, hkv, t, s in ((16, 8, 4096, 1), (1, 8, 8192, None))
            for p in (False, True)
        ]
        cases += [
            (f"rmsnorm_e4m3_N{n}{'_residual' if r else ''}", lambda n=n, r=r: rmsnorm_e4m3(4096, n, r))
            for n in (4096, 16384)
            for r in (False, True)
        ]
        cases += [(f"swiglu_e4m3_N{n}", lambda n=n: glu_e4m3(4096, n)) for n in (4096, 14336)]
        cases += [
            (
                "quantize_e4m3_row_N4096",
                lambda: launch_quantize_fp8(
                    empty(4096, 4096, dtype=bf16), empty(4096, 4096, dtype=e4m3), empty(4096), "row"
                ),
            )
        ]
    elif case_set == "moe":
        from llmk.moe.triton_moe_routing import launch_moe_route

        def route(t, e, k, scoring):
            launch_moe_route(empty(t, e, dtype=bf16), k, scoring, True, empty(t, k), empty(t, k, dtype=torch.int32))

        cases += [
            (f"moe_route_E{e}_top{k}_{scoring}", lambda a=(16384, e, k, scoring): route(*a))
            for e, k, scoring in ((128, 8, "softmax"), (8, 2, "softmax"), (256, 8, "sigmoid"))
        ]
        from llmk.moe import triton_moe_gemm as gemm

        try:
            from llmk.moe import triton_moe_rows_tma as tma

            tma.sm_count = lambda *args: 132  # an H100's or H200's
        except ImportError:  # a tree from before the persistent kernel
            tma = None

        def experts(t, h, inter, e, k):
            """The launches of one forward and backward at these widths (six GEMMs, the SwiGLU
            backward's pass, one row gather); the older forms where this tree has them."""
            rows = t * k
            order, offsets, scale = empty(rows, dtype=torch.int64), empty(e + 1, dtype=torch.int64), empty(rows)
            x, w1, w2 = empty(t, h, dtype=bf16), empty(e, 2 * inter, h, dtype=bf16), empty(e, h, inter, dtype=bf16)
            pre, hid, y = empty(rows, 2 * inter, dtype=bf16), empty(rows, inter, dtype=bf16), empty(rows, h, dtype=bf16)
            gemm.launch_expert_rows(x, w1, hid, order, offsets, gather=True, epilogue="glu", top_k=k, pre=pre)
            gemm.launch_expert_rows(hid, w2, y, order, offsets, gather=False, epilogue="scatter", scale=scale)
            if hasattr(gemm, "launch_glu_backward_rows"):
                gemm.launch_expert_rows(
                    x,
                    w2.transpose(1, 2),
                    pre[:, :inter],
                    order,
                    offsets,
                    gather=True,
                    epilogue="store",
                    top_k=k,
                    scale=scale,
                    a_copy=y,
                )
                gemm.launch_glu_backward_rows(pre, pre, order, scale, empty(t, k), "silu")
            else:  # the SwiGLU backward in the GEMM's epilogue, its d weight in column-tile partials
                config = gemm.rows_config(rows, e, "glu_backward", inter, h)
                gemm.launch_expert_rows(
                    x,
                    w2.transpose(1, 2),
                    None,
                    order,
                    offsets,
                    gather=True,
                    epilogue="glu_backward",
                    top_k=k,
                    scale=scale,
                    pre=pre,
                    dpre=pre,
                    partial=empty(gemm.n_tiles(inter, config), rows),
                    config=config,
                )
            gemm.launch_expert_rows(pre, w1.transpose(1, 2), y, order, offsets, gather=False, epilogue="scatter")
            if not hasattr(gemm, "launch_gather_rows"):  # the weight kernel gathered its rows itself
                gemm.launch_expert_weight_grad(pre, x, w1, order, offsets, a_gather=False, b_gather=True, top_k=k)
                gemm.launch_expert_weight_grad(
                    x, hid, w2, order, offsets, a_gather=True, b_gather=False, top_k=k, scale=scale
                )
                return
            gemm.launch_expert_weight_grad(pre, gemm.launch_gather_rows(x, order, k), w1, offsets, kind="gate_up")
            gemm.launch_expert_weight_grad(y, hid, w2, offsets, kind="down")
            if tma is None:
                return
            # the persistent TMA forms of gate/up, down and dx, where MOE_CONFIGS gives the run a tile
            for epilogue, a, b, c, kw in (
                ("glu", x, w1, hid, dict(top_k=k, pre=pre)),
                ("scatter", hid, w2, y, dict(scale=scale)),
                ("scatter", pre, w1.transpose(1, 2), y, {}),
            ):
                config = gemm.rows_config(rows, e, epilogue + "_tma", c.shape[1], b.shape[2])
                if config is not None:
                    tma.launch_expert_rows_tma(a, b, c, order, offsets, config, epilogue=epilogue, **kw)

        cases += [
            ("moe_experts_qwen3_T16384", lambda: experts(16384, 2048, 768, 128, 8)),
            ("moe_experts_qwen3_T16", lambda: experts(16, 2048, 768, 128, 8)),
            ("moe_experts_mixtral_T4096", lambda: experts(4096, 4096, 14336, 8, 2)),
        ]
    failed = 0
    for case, launch in cases:
        try:
            compile_launches(case, launch)
        except Exception as e:  # a launcher this tree does not have, or calls differently
            failed += 1
            print(f"FAILED {case}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# compare mode


def main(argv):
    if argv[:1] == ["--compile"]:
        return _compile_cases(*argv[1:4])
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    rev, sets = argv[0], argv[1:] or list(SETS)
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        print(f"unknown case set(s) {unknown}; choose from {SETS}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        other = pathlib.Path(tmp, "tree")
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other), rev], check=True, capture_output=True
        )
        try:
            differ = 0
            for case_set in sets:
                outs = {}
                for label, tree in (("rev", other), ("work", ROOT)):
                    out = outs[label] = pathlib.Path(tmp, f"{label}_{case_set}")
                    out.mkdir()
                    env = dict(os.environ, TRITON_CACHE_DIR=str(pathlib.Path(tmp, f"cache_{label}")))
                    proc = subprocess.run(
                        [sys.executable, __file__, "--compile", str(tree), str(out), case_set],
                        env=env,
                        capture_output=True,
                        text=True,
                    )
                    for line in proc.stdout.splitlines():
                        if line.startswith("FAILED"):
                            print(f"{label}: {line}")
                    if proc.returncode:  # the set did not run in that tree: its kernels show as missing there
                        print(f"{label}: the {case_set} set exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
                names = sorted({p.name for out in outs.values() for p in out.glob("*.ptx")})
                for name in names:
                    a, b = (outs[label] / name for label in ("rev", "work"))
                    if not (a.exists() and b.exists()):
                        print(f"{name[:-4]:70s} only in {'the working tree' if b.exists() else rev}")
                        continue
                    pa, pb = normalized_ptx(a.read_text()), normalized_ptx(b.read_text())
                    differ += pa != pb
                    verdict = "IDENTICAL" if pa == pb else f"DIFFERENT ({len(pa)} vs {len(pb)} lines)"
                    print(f"{name[:-4]:70s} {verdict}", flush=True)
            print(f"{differ} kernel(s) differ from {rev}")
            return 1 if differ else 0
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], capture_output=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
