"""Reading nnfusion_rt.cu (core/nnfusion/generated.py, core/nnfusion/usage.py) on code written the way NNFusion writes
it: a BlockFusion kernel's block-function calls are told apart by the tensors they write."""

from __future__ import annotations

from core.nnfusion.generated import parse_generated
from core.nnfusion.usage import analyse

# Written as NNFusion's BlockFusion pass writes it (tests/test_zoo.py's TCN: seven bias Broadcasts deduped to one
# block function, then a conv): here two Relus share one function and the conv's blocks are split over two ranges.
SOURCE = """
// Node name:\tRelu_3
// Description:\tRelu
// Input:
//\t- name: Parameter_0_0\ttype: float\tshape: Shape{64}
// Output:
//\t- name: Relu_3_0\ttype: float\tshape: Shape{64}
__device__ __noinline__ void Relu_float_float_cuda_Relu_3_block_kernel(float* input0, float* output0, int thread_id, \
int block_id, char *shared_buffer)
{
    output0[thread_id] = input0[thread_id] > 0 ? input0[thread_id] : 0;
}
// Node name:\tConvolution_7
// Description:\tConvolution
// Input:
//\t- name: Parameter_0_0\ttype: float\tshape: Shape{1, 4, 8, 8}
// Output:
//\t- name: Convolution_7_0\ttype: float\tshape: Shape{1, 4, 8, 8}
__device__ __noinline__ void Convolution_float_float_float_cuda_Convolution_7_block_kernel(float* input0, \
float* input1, float* output0, int thread_id, int block_id, char *shared_buffer)
{
    output0[block_id * 64 + thread_id] = input0[thread_id] * input1[0];
}
extern "C" __global__  void BlockFusionKernel_float_float_cuda_Relu_Relu_Convolution_0(float* input0, \
float* input1, float* input2, float* output0, float* output1, float* output2)
{
    if ((int)blockIdx.x >= 0 && (int)blockIdx.x <= 0)
    {
        Relu_float_float_cuda_Relu_3_block_kernel(input0, output0, threadIdx.x, blockIdx.x - 0 + 0, NULL);
    }
    else if ((int)blockIdx.x >= 1 && (int)blockIdx.x <= 1)
    {
        Relu_float_float_cuda_Relu_3_block_kernel(input1, output1, threadIdx.x, blockIdx.x - 1 + 0, NULL);
    }
    else if ((int)blockIdx.x >= 2 && (int)blockIdx.x <= 3)
    {
        Convolution_float_float_float_cuda_Convolution_7_block_kernel(input0, input2, output2, threadIdx.x, \
blockIdx.x - 2 + 0, NULL);
    }
    else if ((int)blockIdx.x >= 4 && (int)blockIdx.x <= 5)
    {
        Convolution_float_float_float_cuda_Convolution_7_block_kernel(input0, input2, output2, threadIdx.x, \
blockIdx.x - 4 + 2, NULL);
    }
}
extern void BlockFusionKernel_float_float_cuda_Relu_Relu_Convolution_0_Call(const dim3 &grids, const dim3 &blocks, \
unsigned mem, cudaStream_t stream, float* input0, float* input1, float* input2, float* output0, float* output1, \
float* output2) {
    BlockFusionKernel_float_float_cuda_Relu_Relu_Convolution_0<<<grids, blocks, mem, stream>>>(input0, input1, \
input2, output0, output1, output2);
}
extern "C" int kernel_entry(float* Parameter_0_0, float** Result_9_0)
{
// name=blockfusion_kernel_11
BlockFusionKernel_float_float_cuda_Relu_Relu_Convolution_0_Call(dim3(6, 1, 1), dim3(64, 1, 1), 0, 0, \
Parameter_0_0, Parameter_1_0, Constant_2_0, Relu_3_0, my_relu_out_0, Convolution_7_0);
return 0;
}
"""


def test_each_node_of_a_blockfusion_kernel_is_named_by_the_tensor_it_writes():
    """Issue 39 #4: the pieces were named after their block function, so nodes sharing one (deduped) were 'a node
    sharing X's kernel' and one node split over several block ranges was listed once per range."""
    generated = parse_generated(SOURCE)
    (step,) = generated.steps
    assert step.call_nodes == ("Relu_3", "my_relu_out", "Convolution_7", "Convolution_7")
    (use,) = analyse(generated, []).steps
    assert [p.node for p in use.parts] == ["Relu_3", "my_relu_out", "Convolution_7"]


def test_calls_whose_tensors_cannot_be_read_keep_the_function_names():
    unbound = SOURCE.replace("Parameter_0_0, Parameter_1_0, Constant_2_0, ", "")  # fewer arguments than parameters
    (use,) = analyse(parse_generated(unbound), []).steps
    assert [p.node for p in use.parts] == ["Relu_3", "a node sharing Relu_3's kernel", "Convolution_7",
                                           "a node sharing Convolution_7's kernel"]


# kernel_entry as NNFusion writes it for Concat(constant, graph input) on axis 1 of a batch of 1 (seen with the
# compiler: tests/test_row_op_type.py), and for a Concat it laid out in place (its first input at the output's address)
SKIPPING = """
Concat_3_0 = (float*)(group_0_CUDA_GPU0_allocator_memory_pool+0);
Relu_2_0 = (float*)(group_0_CUDA_GPU0_allocator_memory_pool+64);
Concat_5_0 = (float*)(group_0_CUDA_GPU0_allocator_memory_pool+64);
Constant_0_0 = (float*)(group_persist_CUDA_GPU0_allocator_memory_pool+0);
extern "C" int kernel_entry(float* Parameter_2_0, float** Result_6_0)
{
// name=cat_out
// eliminated: Concat_float_float_float_cuda_Concat_3_Call(dim3(1, 1, 1), dim3(512, 1, 1), 0, 0, Constant_0_0, \
Parameter_2_0, Concat_3_0);
// name=laid_out
// eliminated: Concat_float_float_float_cuda_Concat_5_Call(dim3(1, 1, 1), dim3(512, 1, 1), 0, 0, Relu_2_0, \
Concat_3_0, Concat_5_0);
// name=from_the_input
// eliminated: Concat_float_float_float_cuda_Concat_7_Call(dim3(1, 1, 1), dim3(512, 1, 1), 0, 0, Parameter_2_0, \
Relu_2_0, Concat_3_0);
return 0;
}
""".replace("\\\n", "")


def test_a_concat_left_out_whose_output_is_not_its_first_input_is_named():
    """NNFusion's ConcatKernel::is_eliminative compares pool offsets, not pools: the constant at offset 0 of the
    persistent pool and the output at offset 0 of the work pool pass it, and nothing writes the output. A Concat
    left out at its first input's own address (laid out in place) is fine; one whose first input is the caller's
    buffer (a graph input) is not."""
    generated = parse_generated(SKIPPING)
    skipped, from_the_input = generated.skipped_copies()
    assert (skipped.node, skipped.first_input, skipped.output) == ("cat_out", "Constant_0_0", "Concat_3_0")
    assert skipped.output_at == ("group_0_CUDA_GPU0_allocator_memory_pool", 0)
    assert "wrong numbers" in skipped.describe()
    # a first input that is kernel_entry's own (the caller's buffer) is in no pool: never the output's memory
    assert (from_the_input.node, from_the_input.first_input_at) == ("from_the_input",
                                                                    ("the caller's buffer Parameter_2_0", 0))
    assert analyse(generated, []).skipped == [skipped, from_the_input]
