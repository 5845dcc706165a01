/* topk.h - the k largest of n scores, for block selection (forward_cpu.c visible_ranges). */
#ifndef PXQ_TOPK_H
#define PXQ_TOPK_H

/* Puts in id[0..k) the indices of the k largest scores of score[0..n), in ascending index order;
 * ties go to the lower index (the order of a stable sort by score, descending). k is clamped to
 * [0, n]; returns it. id needs room for n ints (it is the working array). Expected O(n + k log k):
 * quickselect (Hoare 1961, "Algorithm 65: Find") on (score desc, index asc), then a sort of the k.
 * NaN scores rank below every number. */
int topk_indices(const float *score, int n, int k, int *id);

#endif
