"""The op x dtype cases (shared by the worker that runs them and the tests that report them)."""
import torch

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int32, torch.int64]
OPS = ["all_reduce_sum", "all_reduce_product", "all_reduce_min", "all_reduce_max",
       "all_reduce_avg", "broadcast", "reduce_sum", "all_gather", "all_gather_into_tensor",
       "reduce_scatter_sum", "reduce_scatter_tensor_sum", "all_to_all_single_equal",
       "all_to_all_single_unequal", "all_to_all", "gather", "scatter", "send_recv"]
WORLD_SIZES = [1, 2, 3, 4]
# dtypes shoal has no reduction for: the operations that only move data take them (as bytes)
MOVE_DTYPES = [torch.bool, torch.int16]
MOVE_OPS = ["broadcast", "all_gather", "all_gather_into_tensor", "all_to_all_single_equal",
            "all_to_all_single_unequal", "all_to_all", "gather", "scatter", "send_recv"]


def case_name(op, dtype, n):
    return "%s-%s-ws%d" % (op, str(dtype).replace("torch.", "") if dtype else "none", n)


def all_cases():
    out = [case_name(op, dt, n) for n in WORLD_SIZES for op in OPS for dt in DTYPES]
    out += [case_name(op, dt, n) for n in WORLD_SIZES for op in MOVE_OPS for dt in MOVE_DTYPES]
    out += [case_name("barrier", None, n) for n in WORLD_SIZES]
    out += [case_name("all_to_all_issue_order", None, n) for n in WORLD_SIZES]
    out += [case_name("collective_in_future_callback", None, n) for n in WORLD_SIZES]
    out += [case_name("wait_in_future_callback", None, n) for n in WORLD_SIZES]
    out += [case_name("future_wait_in_future_callback", None, n) for n in WORLD_SIZES]
    out += [case_name("future_marked_after_wait", None, n) for n in WORLD_SIZES]
    out += [case_name("completion_threads_few", None, n) for n in WORLD_SIZES]
    out += [case_name("all_to_all_single_empty_ranks", None, n) for n in WORLD_SIZES]
    return out
