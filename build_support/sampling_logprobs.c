/* One row's log-softmax at the emitted token and its best alternatives (mtp_bindings.generation.logprobs):
   the prefilter's candidates, then one vectorized exp-sum over the row (sampling_exp.c). After
   sampling_round.c (its status codes). */

/* The log-softmax of row[0..n): its log-sum-exp in *out_lse, and the k (<= n) most likely tokens, highest logit
   first (the lower id of a tie first), in top_ids with their log-probabilities in top_logprobs. scratch: room
   for n ids. Returns how many were written (k), or MTP_ROUND_ERR_MEMORY. */
static int32_t mtp_row_logprobs(const float * row, int32_t n, int32_t k, int32_t * scratch, int32_t * top_ids,
                                double * top_logprobs, double * out_lse) {
    if (row == NULL || n < 1 || k < 0 || k > n || out_lse == NULL || (k > 0 && (scratch == NULL || top_ids == NULL || top_logprobs == NULL))) {
        return MTP_ROUND_ERR_CHAIN;
    }
    float top = -INFINITY;
    int32_t m = -1;
    if (k > 0) {
        m = mtp_top_k_superset(row, n, k, scratch);
        if (m == -2) {
            return MTP_ROUND_ERR_MEMORY;
        }
        if (m < 0) { /* a short row: every token is a candidate */
            for (int32_t i = 0; i < n; ++i) {
                scratch[i] = i;
            }
            m = n;
        }
        for (int32_t j = 0; j < m; ++j) { /* the candidates hold the row's maximum */
            top = row[scratch[j]] > top ? row[scratch[j]] : top;
        }
    } else {
        top = mtp_row_max(row, n, NULL);
    }
    const double lse = (double) top + log(mtp_exp_weights(row, n, top, NULL));
    *out_lse = lse;
    for (int32_t j = 0; j < k; ++j) { /* a selection of the k best among the candidates */
        int32_t best = j;
        for (int32_t c = j + 1; c < m; ++c) {
            const float a = row[scratch[c]], b = row[scratch[best]];
            if (a > b || (a == b && scratch[c] < scratch[best])) {
                best = c;
            }
        }
        const int32_t t = scratch[j];
        scratch[j] = scratch[best];
        scratch[best] = t;
        top_ids[j] = scratch[j];
        top_logprobs[j] = (double) row[scratch[j]] - lse;
    }
    return k;
}
