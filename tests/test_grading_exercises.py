"""The exercises of chapters 11, 13 and 17 end to end: wrong versions, graded boxed, are rejected
with the message of their mistake; the library's block cannot stand in for the student's."""

import textwrap

import pytest
from _grading_cases import edited, table

from course.classroom import gradebook

CLASS = {  # student: (exercise, {solution cell: source}, {task: words the reason must contain})
    "w11_program_id_order": ("11_fusing_ssd", {"work_of_ticket": textwrap.dedent("""
        def work_of_ticket(ticket, n_chains, n_chunks):
            return ticket % n_chains, n_chunks - 1 - ticket // n_chains
        """)}, {"work_of_ticket": "DEADLOCK"}),
    "w11_release_before_store": ("11_fusing_ssd", {"pass_state_ops": textwrap.dedent("""
        def pass_state_ops(chunk):
            return [("acquire", chunk), ("load", chunk), ("release", chunk + 1),
                    ("store", chunk + 1)]
        """)}, {"pass_state_ops": "before it was stored"}),
    "w13_conv_not_causal": ("13_model", {"mamba_block": textwrap.dedent("""
        def mamba_block(hidden, w):
            n, r = w["mixer.A_log"].shape[1], w["mixer.dt_proj.weight"].shape[1]
            u = rms_norm(hidden, w["norm.weight"])
            x, z = F.linear(u, w["mixer.in_proj.weight"]).chunk(2, dim=-1)
            k = w["mixer.conv_weight"].shape[1]
            x = F.conv1d(F.pad(x.transpose(1, 2), ((k - 1) // 2, k - 1 - (k - 1) // 2)),
                         w["mixer.conv_weight"][:, None], w["mixer.conv_bias"], groups=x.shape[-1])
            x = F.silu(x)
            dt, B, C = F.linear(x.transpose(1, 2), w["mixer.x_proj.weight"]).split([r, n, n], -1)
            delta = F.linear(dt, w["mixer.dt_proj.weight"]).transpose(1, 2)
            y = selective_scan_sequential(x, delta, -torch.exp(w["mixer.A_log"]), B.transpose(1, 2),
                                          C.transpose(1, 2), w["mixer.D"], z.transpose(1, 2),
                                          w["mixer.dt_proj.bias"], delta_softplus=True)
            return hidden + F.linear(y.transpose(1, 2), w["mixer.out_proj.weight"])
        """)}, {"mamba_block": "not causal"}),
    "w17_mask_for_multiples_only": ("17_silent_bugs", {"row_sums_kernel": textwrap.dedent("""
        @triton.jit
        def row_sums_kernel(x_ptr, out_ptr, n, stride_row, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            start = 0
            while start < n:
                j = start + tl.arange(0, BLOCK)
                acc += tl.load(x_ptr + row * stride_row + j, mask=j < (n // BLOCK) * BLOCK + BLOCK)
                start += BLOCK
            tl.store(out_ptr + row, tl.sum(acc, axis=0))
        """)}, {"row_sums": "read past the end of a row"}),
    "w17_float64_in_arrival_order": ("17_silent_bugs", {
        "deterministic_scatter_sum": textwrap.dedent("""
        def deterministic_scatter_sum(parts, target, arrival, rows):
            out = torch.zeros(rows, parts.shape[1], dtype=torch.float64)
            for k in arrival.tolist():
                out[target[k]] += parts[k].double()
            return out.float()
        """)}, {"deterministic_scatter_sum": "differ in their bits"}),
    "w13_uses_the_library_block": ("13_model", {"mamba_block": textwrap.dedent("""
        from mambalearn import model
        def mamba_block(hidden, w):
            cfg = model.MambaConfig(d_model=hidden.shape[-1], d_state=w["mixer.A_log"].shape[1],
                                    d_conv=w["mixer.conv_weight"].shape[1],
                                    expand=w["mixer.conv_weight"].shape[0] // hidden.shape[-1],
                                    dt_rank=w["mixer.dt_proj.weight"].shape[1])
            block = model.Block(cfg).double()
            block.load_state_dict(w)
            return block(hidden)
        """)}, {"mamba_block": "chapter 13's own library"}),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("exercises")
    for student, (exercise, replace, _) in CLASS.items():
        edited(f"solutions/{exercise}.ipynb", root / student / f"{exercise}.ipynb", replace=replace)
    chosen = sorted({exercise for exercise, _, _ in CLASS.values()})
    rows, _, _ = gradebook.grade_class(root, chosen, jobs=2, timeout=120)
    return table(rows)


@pytest.mark.slow
@pytest.mark.parametrize("student", sorted(CLASS))
def test_wrong_versions_are_rejected_with_their_mistake(graded, student):
    exercise, _, failing = CLASS[student]
    got = {t: v for t, v in graded[student].items() if v[1] != "not submitted"}
    for task, (ok, why) in got.items():
        if task in failing:
            assert not ok and failing[task] in why, (task, why)
        else:
            assert ok, (task, why)
