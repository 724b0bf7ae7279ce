"""The identifier must be byte-for-byte what NNFusion's compiler builds, or the row is never fetched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.kernels.opsig import ConvParams, DotParams, OpSignature, PoolParams, signature_from_attributes


def conv(op: str = "Convolution") -> OpSignature:
    data, filt, out = (1, 3, 227, 227), (64, 3, 11, 11), (1, 64, 55, 55)
    inputs = (data, filt, out) if op == "Fused_Convolution_Add_Relu" else (data, filt)
    return OpSignature(op, inputs, (out,), ConvParams((4, 4), (1, 1), (0, 0)))


def test_convolution_matches_the_documented_example():
    assert conv().identifier == (
        "Convolution1,3,227,227;64,3,11,11;1,64,55,55floatfloatfloat"
        "Strides{4, 4}Strides{1, 1}CoordinateDiff{0, 0}"
    )


def test_fused_conv_relu_appends_the_relu_member():
    assert conv("Fused_Convolution_Relu").identifier == conv().identifier + "Relu1,64,55,55;1,64,55,55floatfloat"


def test_fused_conv_add_relu_appends_add_then_relu_and_keeps_conv_inputs_only():
    assert conv("Fused_Convolution_Add_Relu").identifier == (
        conv().identifier
        + "Add1,64,55,55;1,64,55,55;1,64,55,55floatfloatfloat"
        + "Relu1,64,55,55;1,64,55,55floatfloat"
    )


def test_dot_is_the_base_rule_and_transposes_stay_out_of_it():
    plain = OpSignature("Dot", ((4, 256), (256, 512)), ((4, 512),), DotParams())
    trans = OpSignature("Dot", ((4, 256), (512, 256)), ((4, 512),), DotParams(False, True))
    assert plain.identifier == "Dot4,256;256,512;4,512floatfloatfloat"
    assert trans.identifier == "Dot4,256;512,256;4,512floatfloatfloat"


def test_pools_include_the_pad_above_part():
    for op in ("AvgPool", "MaxPool"):
        sig = OpSignature(op, ((1, 64, 56, 56),), ((1, 64, 28, 28),), PoolParams((3, 3), (2, 2), (1, 1), (0, 0)))
        assert sig.identifier == (
            f"{op}1,64,56,56;1,64,28,28floatfloatShape{{3, 3}}Strides{{2, 2}}Shape{{1, 1}}Shape{{0, 0}}"
        )


def test_elementwise_ops_follow_the_base_rule():
    assert OpSignature("Relu", ((2, 3),), ((2, 3),)).identifier == "Relu2,3;2,3floatfloat"
    assert OpSignature("Add", ((8,), (8,)), ((8,),)).identifier == "Add8;8;8floatfloatfloat"


def test_attributes_round_trip_to_the_same_identifier():
    for sig in (conv(), conv("Fused_Convolution_Relu"), conv("Fused_Convolution_Add_Relu"),
                OpSignature("Dot", ((4, 256), (256, 512)), ((4, 512),), DotParams()),
                OpSignature("MaxPool", ((1, 8, 8, 8),), ((1, 8, 4, 4),), PoolParams((2, 2), (2, 2), (0, 0), (0, 0))),
                OpSignature("Relu", ((2, 3),), ((2, 3),))):
        assert signature_from_attributes(sig.op_type, sig.attributes()).identifier == sig.identifier


def every_kind(dtype: str) -> list[OpSignature]:
    """One signature of each identifier rule (conv family, pools, Dot, one- and two-input element-wise)."""
    return [replace(sig, dtype=dtype) for sig in (
        conv(), conv("Fused_Convolution_Relu"), conv("Fused_Convolution_Add_Relu"),
        OpSignature("Dot", ((4, 256), (256, 512)), ((4, 512),), DotParams()),
        OpSignature("AvgPool", ((1, 8, 8, 8),), ((1, 8, 4, 4),), PoolParams((2, 2), (2, 2), (0, 0), (0, 0))),
        OpSignature("Relu", ((2, 3),), ((2, 3),)), OpSignature("Add", ((8,), (8,)), ((8,),)))]


@pytest.mark.parametrize("dtype", ["half", "double"])
def test_the_dtype_is_named_once_per_tensor_in_every_rule(dtype: str):
    """A half kernel stored under a float identifier would be fetched for float ops, and the other way round."""
    for sig, float_sig in zip(every_kind(dtype), every_kind("float"), strict=True):
        assert sig.identifier == float_sig.identifier.replace("float", dtype), sig.op_type
        assert signature_from_attributes(sig.op_type, sig.attributes()).identifier == sig.identifier


@pytest.mark.parametrize("dtype", ["half", "double"])
def test_a_kernel_json_item_of_another_dtype_gets_that_dtype_in_its_identifier(dtype: str):
    from core.demo import demo_kernels
    from core.kernels.kernel_json import validate_item

    for item in demo_kernels()[:-1]:  # one item of each op the demo has
        ours = validate_item({**item, "dtype": dtype}).op
        float_one = validate_item(item).op
        assert ours.dtype == dtype and ours.identifier == float_one.identifier.replace("float", dtype), item["op_type"]
