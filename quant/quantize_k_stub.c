/* temporary */
#include <string.h>
#include "quant/quantize_impl.h"
#include "quant/blocks.h"
void ds4_quantize_row_iq2_xxs(const float *x, void *dst, int64_t n, const float *imatrix) { (void)x; (void)imatrix; memset(dst, 0, (size_t)(n / QK_K) * sizeof(block_iq2_xxs)); }
