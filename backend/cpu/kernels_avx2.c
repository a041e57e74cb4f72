#include "backend/cpu/cpu_matmul_kernels.h"
ds4_dot_fn ds4_cpu_dot_avx2(ds4_type type) { (void)type; return NULL; }
