"""precswitch.fast_paths: which 16-bit types the CPU computes natively, and the study's one start line."""

from precswitch.fast_paths import cpu_fast_paths, cpu_flags, study_precisions, study_time_note

AVX2 = "fpu sse sse2 avx avx2 fma f16c".split()  # the AMD EPYC of docs/findings.md: f16c converts only
AMX = AVX2 + "avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile".split()
DEFAULT = {"device": "cpu", "schedules": {
    "fp32-fp32": {"pretrain": "fp32", "finetune": "fp32"},
    "fp16-fp32": {"pretrain": "amp_fp16", "finetune": "fp32"},
    "bf16-fp32": {"pretrain": "amp_bf16", "finetune": "fp32"}}}


def test_flags_are_read_from_cpuinfo_text_x86_and_arm():
    assert "avx2" in cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 fma\n")
    assert cpu_flags("processor : 0\nFeatures : fp asimd asimdhp bf16\n") == {"fp", "asimd", "asimdhp", "bf16"}
    assert cpu_flags("processor : 0\n") is None


def test_fast_paths_per_type():
    assert cpu_fast_paths(AVX2) == {"bf16": False, "fp16": False}
    assert cpu_fast_paths(AMX) == {"bf16": True, "fp16": True}
    assert cpu_fast_paths(AVX2 + ["avx512_bf16"]) == {"bf16": True, "fp16": False}


def test_avx2_cpu_gets_one_line_naming_the_slow_precisions():
    note = study_time_note(DEFAULT, flags=AVX2)
    assert note is not None and "\n" not in note
    assert "bf16/fp16" in note and "amp_bf16, amp_fp16" in note and "4-5x" in note


def test_no_line_with_a_fast_path_on_a_gpu_or_without_16bit_precisions():
    assert study_time_note(DEFAULT, flags=AMX) is None
    assert study_time_note({**DEFAULT, "device": "cuda:0"}, flags=AVX2) is None
    fp32_only = {"device": "cpu", "schedules": {"fp32-fp32": {"pretrain": "fp32", "finetune": "fp32"}}}
    assert study_time_note(fp32_only, flags=AVX2) is None


def test_only_the_type_without_a_fast_path_is_named():
    note = study_time_note(DEFAULT, flags=AVX2 + ["avx512_bf16"])
    assert note is not None and "no fp16 fast path" in note and "amp_fp16" in note and "amp_bf16" not in note


def test_switches_and_sweeps_count():
    cfg = {"schedules": {"x": {"pretrain": {"precision": "fp32", "switch_to": "pure_bf16", "switch_at": 0.5},
                                "finetune": "fp32"}},
           "sweeps": {"s": {"pretrain": "fp32", "finetune": {"precision": "pure_fp16", "switch_to": "fp32"},
                            "switch_at": [0.5]}}}
    assert study_precisions(cfg) == {"fp32", "pure_bf16", "pure_fp16"}
    assert "pure_bf16, pure_fp16" in study_time_note(cfg, flags=AVX2)
