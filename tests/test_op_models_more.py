"""Per-operator models where the peer's goldens differed (issue 49, item 6): an ``out=`` tensor
counted once, ROCm's ``miopen_*`` convolution and batch norm, ``clamp_min_``, ``linalg_norm``
(and the norms' ``dim`` position), and a model registered for a custom op. Each number is
derived by hand in its comment."""

from __future__ import annotations

from traceview.analyses.op_models import OpModel, family, model, register

BF16, F32 = "c10::BFloat16", "float"


def test_an_out_tensor_is_written_once_not_read() -> None:
    # aten::mul(self [512] bf16, other: a 0-d double, out [512] bf16): 1024 + 8 read, 1024
    # written = 2056 (TraceLens's count); before: out read as an input too, 3080
    m = model("aten::mul", [[512], [], [512]], [BF16, "double", BF16], ["", "2.0", ""])
    assert (m.flops, m.bytes) == (512, 2056)
    # add.out(self, other, alpha, out): the out tensor is the fourth
    m = model("aten::add", [[4, 8], [4, 8], [], [4, 8]], [F32, F32, "Scalar", F32], [])
    assert (m.flops, m.bytes) == (32, 3 * 128)
    # without out=: unchanged
    m = model("aten::mul", [[4, 8], [4, 8]], [F32, F32], [])
    assert (m.flops, m.bytes) == (32, 3 * 128)


def test_miopen_convolution() -> None:
    # x [10,256,14,14], w [512,256,3,3], padding 1, stride 1: out [10,512,14,14] = 1,003,520
    # elements; FLOPs 2 x 1,003,520 x 256·9 = 4,624,220,160; bytes (bf16) x 1,003,520 +
    # w 2,359,296 + out 2,007,040 = 5,369,856; the same as aten::convolution's
    dims = [[10, 256, 14, 14], [512, 256, 3, 3], [], [], [], [], [], [], []]
    types = [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar",
             "Scalar"]
    concrete = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1", "False", "False"]
    m = model("aten::miopen_convolution", dims, types, concrete)
    assert (m.category, m.flops, m.bytes, m.dtype) == ("conv", 4_624_220_160, 5_369_856,
                                                       "bf16")
    ref = model("aten::convolution", [[10, 256, 14, 14], [512, 256, 3, 3], [], [], [], [], [],
                                      [], []],
                [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Scalar",
                 "ScalarList", "Scalar"],
                ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"])
    assert (ref.flops, ref.bytes) == (m.flops, m.bytes)
    # stride 2, no padding, 1x1: out [10,512,7,7] = 250,880; FLOPs 2 x 250,880 x 256
    m = model("aten::miopen_convolution", [[10, 256, 14, 14], [512, 256, 1, 1], *dims[2:]],
              types, ["", "", "", "[0, 0]", "[2, 2]", "[1, 1]", "1", "False", "False"])
    assert m.flops == 2 * 250_880 * 256
    # transposed: x [1,4,5,5], w [4,2,3,3], stride 2 -> out [1,2,11,11]; FLOPs 2·numel(x)·
    # prod(w[1:]) = 2 x 100 x 18
    t = model("aten::miopen_convolution_transpose",
              [[1, 4, 5, 5], [4, 2, 3, 3], [], [], [], [], [], [], [], []],
              [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar",
               "Scalar", "Scalar"],
              ["", "", "", "[0, 0]", "[0, 0]", "[2, 2]", "[1, 1]", "1", "False", "False"])
    assert t.flops == 2 * 100 * 18
    assert t.bytes == (100 + 72 + 2 * 121) * 4


def test_miopen_batch_norm_forward_and_backward() -> None:
    # x [8,16,32,32] float = 131,072 elements; weight, bias, running mean and var [16]:
    # FLOPs 7 x 131,072 = 917,504; bytes 524,288 + 4 x 64 read, 524,288 written
    dims = [[8, 16, 32, 32], [16], [16], [16], [16], [], [], []]
    types = [F32, F32, F32, F32, F32, "Scalar", "Scalar", "Scalar"]
    m = model("aten::miopen_batch_norm", dims, types, [])
    assert (m.category, m.flops, m.bytes) == ("reduce", 917_504, 1_048_832)
    # backward (input, grad_output, weight, running_mean, running_var, save_mean, save_var,
    # epsilon): 9 FLOPs an element; reads x, dy, five [16] vectors; writes dx
    b = model("aten::miopen_batch_norm_backward",
              [[8, 16, 32, 32], [8, 16, 32, 32], [16], [16], [16], [16], [16], []],
              [F32] * 7 + ["Scalar"], [])
    assert (b.flops, b.bytes) == (9 * 131_072, 2 * 524_288 + 5 * 64 + 524_288)


def test_clamp_min_and_linalg_norm() -> None:
    # clamp_min_(x [10,512,7,7] bf16, Scalar): 250,880 FLOPs, read and written once
    m = model("aten::clamp_min_", [[10, 512, 7, 7], []], [BF16, "Scalar"], ["", "0"])
    assert (m.category, m.flops, m.bytes) == ("elementwise", 250_880, 2 * 250_880 * 2)
    # linalg_norm(x [4,8], ord, dim=[1]): 32 FLOPs; 128 read, 4 x 4 written
    n = model("aten::linalg_norm", [[4, 8], [], [], [], []], [F32, "", "ScalarList",
                                                              "Scalar", ""],
              ["", "", "[1]", "False", ""])
    assert (n.category, n.flops, n.bytes) == ("reduce", 32, 144)
    # linalg_vector_norm(x, ord=2, dim=[1]): dim is the third argument, not ord
    v = model("aten::linalg_vector_norm", [[4, 8], [], [], [], []],
              [F32, "Scalar", "ScalarList", "Scalar", ""], ["", "2", "[1]", "False", ""])
    assert v.bytes == 144


def test_a_custom_op_gets_a_registered_model() -> None:
    name = "myext::fused_rms_norm"
    assert family(name) is None

    def rms(op: str, dims, types, concrete) -> OpModel | None:
        x = dims[0]
        n = 1
        for d in x:
            n *= d
        return OpModel("reduce", 4 * n, 2 * n * 2 + x[-1] * 2, "bf16")

    register(name, rms)
    try:
        m = model(name, [[2, 1024], [1024]], [BF16, BF16], [])
        assert (m.category, m.flops, m.bytes) == ("reduce", 8192, 2 * 2048 * 2 + 2048)
    finally:
        from traceview.analyses import op_models
        op_models._FAMILIES.pop(name)
    assert family(name) is None
