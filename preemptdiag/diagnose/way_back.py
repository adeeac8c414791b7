"""How to apply a lever and when to take it back: where the change goes (the engine's
launch command, the container's memory limit) and the signal that means rolling back
to the previous value."""

from __future__ import annotations

from dataclasses import replace

from preemptdiag.model.records import Class, Lever

_LAUNCH = {
    "vllm": "`vllm serve MODEL ... {flag}` (in Kubernetes or Helm: the engine container's "
    "`args`; in docker compose: `command:`), then restart the engine",
    "sglang": "`python -m sglang.launch_server ... {flag}` (in Kubernetes or Helm: the "
    "container's `args`), then restart the server",
}
# Per class: what, in the next run under the same load, says the change made it worse.
_BACK_IF = {
    Class.THRASH_LOOP: "completed requests per minute fall, or p99 end-to-end latency rises, "
    "against the run before the change",
    # (whatever the device: a CUDA or HIP OOM, or, on the CPU backend, the host's RAM)
    Class.ALLOCATION_FAILURE: "the engine still fails to start, or now fails under load "
    "(out of memory while serving)",
    Class.HOST_PRESSURE: "the node reports memory pressure or evicts other pods, or the pod can "
    "no longer be scheduled",
}


def with_way_back(lever: Lever, cls: Class) -> Lever:
    """The lever with `apply` and `rollback` filled in (a no-change lever has neither)."""
    if lever.knob is None or lever.proposed is None:
        return lever
    if lever.knob == "container memory limit":
        apply = (
            f"set the engine container's memory limit to {lever.proposed} (Kubernetes/Helm: "
            f"`resources.limits.memory`, and the request to match; docker: `--memory`)"
        )
    else:
        flag = f"{lever.knob} {lever.proposed}"
        apply = _LAUNCH.get(lever.engine, _LAUNCH["vllm"]).format(flag=flag)
    before = (
        f"`{lever.knob} {lever.current}`"
        if lever.current and lever.knob.startswith("--")
        else f"{lever.current}"
        if lever.current
        else f"the launch command without {lever.knob} (its default)"
        if lever.knob.startswith("--")
        else "the previous limit"
    )
    signal = _BACK_IF.get(cls, "the next run is worse than the one before the change")
    return replace(lever, apply=apply, rollback=f"restore {before} if {signal}")
