from preemptdiag.scan.lines import engine_ts_before, normalise, proc_before, repeat_count


def test_kubectl_timestamp_is_peeled_and_kept():
    line = normalise(
        "2025-10-15T00:02:38.756689123Z (APIServer pid=1) INFO 10-14 17:02:38 "
        "[loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s"
    )
    assert line.ts_wrapper == "2025-10-15T00:02:38.756689123Z"
    assert line.ts_kind == "iso"
    assert line.text.startswith("(APIServer pid=1) INFO 10-14 17:02:38")


def test_docker_json_record_is_unwrapped():
    line = normalise(
        '{"log":"INFO 05-13 10:00:05 metrics.py:351] Avg prompt throughput: 1.0 tokens/s\\n",'
        '"stream":"stdout","time":"2024-05-13T10:00:05.123456789Z"}'
    )
    assert line.text == "INFO 05-13 10:00:05 metrics.py:351] Avg prompt throughput: 1.0 tokens/s"
    assert line.ts_wrapper == "2024-05-13T10:00:05.123456789Z"


def test_ansi_and_syslog_mangled_ansi_are_stripped():
    assert normalise("\x1b[1;36m(VllmWorkerProcess pid=7)\x1b[0;0m INFO x").text == (
        "(VllmWorkerProcess pid=7) INFO x"
    )
    assert normalise("#033[2m#033[33m(raylet)#033[0m killed").text == "(raylet) killed"


def test_sglang_bracket_with_rank():
    line = normalise("[2025-03-07 21:49:33 TP13] Decode out of memory happened.")
    assert (line.ts_wrapper, line.ts_kind, line.rank) == ("2025-03-07 21:49:33", "sql", "TP13")
    assert line.text == "Decode out of memory happened."


def test_blockquote_crlf_and_kubectl_prefix():
    assert (
        normalise("> > Sequence group 1 is preempted\r\n").text == "Sequence group 1 is preempted"
    )
    line = normalise("[pod/vllm-0/server] 2025-01-01T00:00:00Z INFO 01-01 00:00:00 x.py:1] hi")
    assert line.pod == "pod/vllm-0/server"
    assert line.ts_wrapper == "2025-01-01T00:00:00Z"


def test_journald_and_dmesg_forms():
    j = normalise("2025-08-19T18:34:30+0000 gpu-node-7 kernel: Out of memory: Killed process 1")
    assert j.ts_wrapper == "2025-08-19T18:34:30+0000"
    s = normalise("Aug 19 18:34:30 gpu-node-7 kernel: [12345.678901] Out of memory: Killed")
    assert (s.ts_kind, s.text) == ("syslog", "Out of memory: Killed")
    d = normalise("[12345.678901] Memory cgroup out of memory: Killed process 9")
    assert (d.ts_kind, d.ts_wrapper) == ("uptime", "12345.678901")
    t = normalise("[Tue Aug 19 18:34:30 2025] Out of memory: Killed process 9")
    assert t.ts_kind == "dmesg_t"


def test_glued_records_take_their_own_timestamp():
    text = (
        "INFO 07-28 06:41:09 [loggers.py:118] Engine 000: a 91.6%INFO 07-28 06:41:19 "
        "[loggers.py:118] Engine 000: b"
    )
    assert engine_ts_before(text, text.index(": b")) == "07-28 06:41:19"
    assert engine_ts_before(text, text.index(": a")) == "07-28 06:41:09"


def test_process_prefix_and_ray_repeat():
    text = "(WorkerDict pid=25017, ip=10.0.4.250) WARNING x [repeated 2x across cluster]"
    assert proc_before(text, 40) == "WorkerDict@10.0.4.250"
    assert repeat_count(text) == 2
    assert repeat_count("plain") == 1


def test_sglangs_rank_under_a_wrapper_names_its_stream() -> None:
    text = "[2025-03-04 10:00:05 DP1 TP3] Decode batch, #running-req: 4, "
    for wrapper in ("2025-03-04T10:00:05.123456789Z ", "Mar  4 10:00:05 node7 sglang[88]: "):
        line = normalise(wrapper + text)
        assert (line.rank, line.text) == ("DP1 TP3", "Decode batch, #running-req: 4, ")
        assert line.ts_kind in ("iso", "syslog")
    # (a bracket with no rank: taken off all the same, as from a bare line)
    line = normalise("2025-03-04T10:00:05Z [2025-03-04 10:00:05] Decode batch, x")
    assert (line.rank, line.text, line.ts_wrapper) == (
        None,
        "Decode batch, x",
        "2025-03-04T10:00:05Z",
    )
