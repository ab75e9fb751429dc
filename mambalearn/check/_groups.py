"""The library's functions in named groups, written once: what a check's ``REBUILDS`` blocks.

A check names a group as ``"@name"`` next to single ``"mambalearn.<module>.<name>"`` targets:
moving a family's code is then a change of a few entries here, not of every check that blocks
it. ``GROUPS`` is a literal (the grader reads it from the source, as it reads ``REBUILDS``, and
never imports a check to learn what to block); `expand` and `rebuilds` give the flat lists.
"""

GROUPS = {
    # every function computing Mamba-1's selective scan y = scan(u, Δ, A, B, C, D) (one signature;
    # chapter 12's made of decode steps too)
    "mamba1 scans": [
        "mambalearn.scan.sequential.selective_scan_sequential",
        "mambalearn.scan.selective.selective_scan_parallel",
        "mambalearn.scan.chunked.selective_scan_chunked",
        "mambalearn.autograd.selective_scan_recompute",
        "mambalearn.autograd.selective_scan_checkpointed",
        "mambalearn.mamba1.api.selective_scan_fn",
        "mambalearn.mamba1.kernel.selective_scan_teaching",
        "mambalearn.inference.scan_by_steps",
    ],
    # Mamba-1's Triton kernels and launchers (chapter 09), the readable and the tuned
    "mamba1 kernels": [
        "mambalearn.mamba1.api.selective_scan_fn",
        "mambalearn.mamba1.api.forward",
        "mambalearn.mamba1.fused.forward.forward",
        "mambalearn.mamba1.fused.recurrent.forward",
        "mambalearn.mamba1.args.run",
        "mambalearn.mamba1.args.SelectiveScanFn",
        "mambalearn.mamba1.kernel.selective_scan_teaching",
        "mambalearn.mamba1.kernel._forward",
        "mambalearn.mamba1.kernel.selective_scan_fwd_kernel",
    ],
    # every function computing SSD's (y, final state) from mamba_ssm's arguments (chapters 10–11)
    "ssd": [
        "mambalearn.mamba2.reference.ssd_chunked",
        "mambalearn.mamba2.reference.ssd_sequential",
        "mambalearn.mamba2.reference.ssd_quadratic",
        "mambalearn.mamba2.reference.mamba_chunk_scan_ref",
        "mambalearn.mamba2.chunk.ssd_forward",
        "mambalearn.mamba2.chunk.ssd_stages",
        "mambalearn.mamba2.api.mamba_chunk_scan_combined",
        "mambalearn.mamba2.fused.forward.ssd_fused_forward",
        "mambalearn.mamba2.fused.forward.fused_forward",
    ],
    # the combine of chapter 03's operator, elementwise: the PyTorch one and chapter 08's Triton one
    "elementwise combines": [
        "mambalearn.ops.combine_elementwise",
        "mambalearn.triton.scan.combine_fn",
    ],
    # every scan of h_t = a_t h_{t−1} + b_t (chapters 02–08)
    "linear scans": [
        "mambalearn.scan.sequential.linear_scan_sequential",
        "mambalearn.scan.hillis_steele.hillis_steele_scan",
        "mambalearn.scan.blelloch.blelloch_scan",
        "mambalearn.scan.chunked.chunked_scan",
        "mambalearn.scan.chunked.scan_reference",
        "mambalearn.autograd.ChunkedScanFn",
        "mambalearn.triton.scan.scan",
    ],
    # one token at a time: the decode step and the scan made of steps (chapter 12)
    "decode steps": [
        "mambalearn.inference.decode_step",
        "mambalearn.inference.scan_by_steps",
        "mambalearn.mamba2.step.selective_state_update",
    ],
}


def expand(targets, groups=None):
    """The flat list of ``targets``, each ``"@group"`` replaced by its members (first mention
    kept, no repeats). An unknown group is a ValueError naming it."""
    groups = GROUPS if groups is None else groups
    out = []
    for t in targets:
        if t.startswith("@"):
            if t[1:] not in groups:
                raise ValueError(f"REBUILDS names the group {t!r}, which "
                                 f"mambalearn/check/_groups.py does not define "
                                 f"(it has: {sorted(groups)})")
            members = groups[t[1:]]
        else:
            members = [t]
        out += [m for m in members if m not in out]
    return out


def rebuilds(table, groups=None):
    """``{task: flat targets}`` of a check module's ``REBUILDS``."""
    return {task: expand(targets, groups) for task, targets in table.items()}
