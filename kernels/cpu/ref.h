// Plain-loop reference twins of every CPU kernel (STYLE §1), templated on the element type so
// they run in fp64 for checks. Same argument order as kernels/cpu/ops.h. Simplest correct
// loops, no tiling, no threads: these are what the fast paths and CUDA kernels are tested
// against, and they are themselves checked by central finite differences in fp64.
#pragma once
#include "kernels/cpu/ref/matmul.h"
#include "kernels/cpu/ref/rmsnorm.h"
#include "kernels/cpu/ref/rope.h"
#include "kernels/cpu/ref/swiglu.h"
#include "kernels/cpu/ref/bias.h"
#include "kernels/cpu/ref/embedding.h"
#include "kernels/cpu/ref/attention.h"
#include "kernels/cpu/ref/cross_entropy.h"
#include "kernels/cpu/ref/zo.h"
#include "kernels/cpu/ref/moe.h"
