/* One verify round of exact speculative sampling over llama.cpp's sampler chain, the whole round in one call
   (mtp_bindings.generation.chain.SamplerChain.verify_round): after a decode has swept the caches every numpy
   call on a row costs tens of microseconds, and a round's rows are best read once, in C. After
   sampling_prefilter.c and sampling_exp.c. */
#include <math.h>
#include <string.h>

enum mtp_round_mode {
    MTP_ROUND_SAMPLE       = 0, /* draw from the chain's distribution; accept a draft with its probability */
    MTP_ROUND_GREEDY_CHAIN = 1, /* the highest logit the chain keeps (the lowest id of a tie) */
    MTP_ROUND_ARGMAX       = 2, /* the raw row's argmax (the first of a tie): a chain that cannot move it */
};

enum mtp_round_status {
    MTP_ROUND_ERR_EMPTY  = -1, /* no candidate left: every logit is -inf */
    MTP_ROUND_ERR_MEMORY = -2,
    MTP_ROUND_ERR_CHAIN  = -3, /* the chain left its candidates outside the buffer it was given */
};

/* the most rows a round verifies (a decode's drafts and the bonus row, with room to spare) */
#define MTP_ROUND_MAX_ROWS 64

/* more candidates than this are put in id order through a bitmap over the vocabulary, not a sort */
#define MTP_ROUND_SORT_MAX 4096

/* What a round needs: the chain and how to read it, and scratch of n_vocab entries each (the caller's: a
   buffer of a few MB mapped and unmapped per row costs as much as the row's work). */
typedef struct mtp_round {
    struct llama_sampler * chain;
    int32_t n_vocab;
    int32_t mode;             /* enum mtp_round_mode */
    int32_t top_k;            /* > 0: the chain may start from mtp_top_k_superset's candidates */
    int32_t stateful;         /* the chain hears every emitted token (penalties, DRY) */
    const int32_t * banned;   /* ascending; a prefilter that kept one of them falls back to the whole row */
    int32_t n_banned;
    llama_token_data * data;  /* the chain's candidates */
    int32_t * ids;            /* the prefilter's ids, then a row's candidates in ascending id */
    double * probs;           /* their weights exp(logit - max), not normalized (mtp_round_distribution) */
    float * dense;            /* a row's candidates' logits (by id, while many are put in id order) */
    uint64_t * present;       /* (n_vocab + 63) / 64 words: which ids are candidates */
    uint64_t rng[4];          /* the round's own uniform numbers (xoshiro256**), seeded by the caller */
    const uint32_t * masks;   /* NULL, or a grammar's mask per row: row i's token t is allowed where bit t % 32 of
                                 masks[i * mask_words + t / 32] is set (llguidance's bitmask) */
    int32_t mask_words;
} mtp_round;

static int mtp_allowed(const uint32_t * mask, int32_t t) {
    return (mask[t >> 5] >> (t & 31)) & 1u;
}

/* xoshiro256** (Blackman and Vigna): a uniform number in [0, 1) of 53 bits; a round draws its numbers here
   rather than from numpy, a call that costs more than the draw after a decode has swept the caches */
static uint64_t mtp_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* the generator's state from a 64-bit seed, spread by splitmix64 (as xoshiro's authors advise) */
static void mtp_round_seed(mtp_round * r, uint64_t seed) {
    for (int i = 0; i < 4; ++i) {
        seed += 0x9E3779B97F4A7C15ull;
        uint64_t z = seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        r->rng[i] = z ^ (z >> 31);
    }
}

static double mtp_round_uniform(mtp_round * r) {
    uint64_t * s = r->rng;
    const uint64_t result = mtp_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = mtp_rotl(s[3], 45);
    return (double) (result >> 11) * 0x1.0p-53;
}

static int mtp_cmp_i32(const void * a, const void * b) {
    const int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;
    return (x > y) - (x < y);
}

static int mtp_cmp_token_id(const void * a, const void * b) {
    const llama_token x = ((const llama_token_data *) a)->id, y = ((const llama_token_data *) b)->id;
    return (x > y) - (x < y);
}

/* Run the chain over row (masked by mask, NULL for none: a forbidden token's logit is -inf): its candidates
   (within r->data) and their count in *size; NULL with *err set. */
static llama_token_data * mtp_round_chain(const mtp_round * r, const float * row, const uint32_t * mask, size_t * size,
                                          int32_t * err) {
    int32_t m = -1;
    if (r->top_k > 0) {
        m = mtp_top_k_superset(row, r->n_vocab, r->top_k, r->ids);
        if (m == -2) {
            *err = MTP_ROUND_ERR_MEMORY;
            return NULL;
        }
        /* the grammar's allowed ones among them: if k or more remain, they hold the allowed top k (each is at
           least the prefilter's floor, which every token left out is below) */
        if (m >= 0 && mask != NULL) {
            int32_t kept = 0;
            for (int32_t i = 0; i < m; ++i) {
                if (mtp_allowed(mask, r->ids[i])) {
                    r->ids[kept++] = r->ids[i];
                }
            }
            m = kept >= r->top_k ? kept : -1;
        }
        /* a banned token among them: fewer than k of the rest may be there */
        for (int32_t i = 0; i < m && r->n_banned > 0; ++i) {
            if (bsearch(&r->ids[i], r->banned, r->n_banned, sizeof(int32_t), mtp_cmp_i32) != NULL) {
                m = -1;
            }
        }
    }
    llama_token_data * d = r->data;
    size_t n = 0;
    if (m >= 0) { /* the same tokens survive top-k as from the whole row, in the vocabulary's order too */
        for (int32_t i = 0; i < m; ++i) {
            d[i].id = r->ids[i];
            d[i].logit = row[r->ids[i]];
            d[i].p = 0.0f;
        }
        n = (size_t) m;
    } else {
        for (int32_t i = 0; i < r->n_vocab; ++i) {
            d[i].id = i;
            d[i].logit = mask == NULL || mtp_allowed(mask, i) ? row[i] : -INFINITY;
            d[i].p = 0.0f;
        }
        n = (size_t) r->n_vocab;
    }
    llama_token_data_array arr = { d, n, -1, false };
    llama_sampler_apply(r->chain, &arr);
    /* XTC moves the start of the array past the tokens it removes */
    if (arr.data < d || arr.data + arr.size > d + r->n_vocab) {
        *err = MTP_ROUND_ERR_CHAIN;
        return NULL;
    }
    *size = arr.size;
    return arr.data;
}

/* The distribution the chain's final dist sampler draws from: the finite candidates in ascending id
   (r->ids) with their weights exp(logit - max) (r->probs, float64; computed in float, as llama.cpp's softmax
   computes them), not normalized: their sum in *total. Returns their count, or MTP_ROUND_ERR_EMPTY. */
static int32_t mtp_round_distribution(const mtp_round * r, llama_token_data * c, size_t size, double * total) {
    float * logits = r->dense; /* the candidates' logits in the order of r->ids */
    int32_t n = 0;
    int ascending = 1; /* a chain that only filters or rescales keeps the row's order: nothing to sort */
    for (size_t j = 0; j < size; ++j) { /* a grammar's mask or a ban leaves -inf */
        const float logit = c[j].logit;
        if (isfinite(logit)) {
            ascending &= n == 0 || c[j].id > r->ids[n - 1];
            r->ids[n] = c[j].id;
            logits[n++] = logit;
        }
    }
    if (n == 0) {
        return MTP_ROUND_ERR_EMPTY;
    }
    if (!ascending && n <= MTP_ROUND_SORT_MAX) {
        for (int32_t j = 0; j < n; ++j) {
            c[j].id = r->ids[j];
            c[j].logit = logits[j];
        }
        qsort(c, (size_t) n, sizeof(llama_token_data), mtp_cmp_token_id);
        for (int32_t j = 0; j < n; ++j) {
            r->ids[j] = c[j].id;
            logits[j] = c[j].logit;
        }
    } else if (!ascending) { /* many: in id order through a bitmap, the logits parked by id in r->probs */
        const int32_t n_words = (r->n_vocab + 63) / 64;
        memset(r->present, 0, (size_t) n_words * sizeof(uint64_t));
        for (int32_t j = 0; j < n; ++j) {
            r->probs[r->ids[j]] = logits[j];
            r->present[r->ids[j] / 64] |= (uint64_t) 1 << (r->ids[j] % 64);
        }
        int32_t o = 0;
        for (int32_t w = 0; w < n_words; ++w) {
            for (uint64_t bits = r->present[w]; bits != 0; bits &= bits - 1) {
                const int32_t id = w * 64 + __builtin_ctzll(bits);
                r->ids[o] = id;
                logits[o++] = (float) r->probs[id];
            }
        }
    }
    *total = mtp_exp_weights(logits, n, mtp_row_max(logits, n, NULL), r->probs);
    return n;
}

/* n numbers of the round's generator, as a sampled round draws them (a replay of its rounds draws the same) */
static void mtp_round_uniforms(mtp_round * r, int32_t n, double * out) {
    for (int32_t i = 0; i < n; ++i) {
        out[i] = mtp_round_uniform(r);
    }
}

/* the sum of p[begin..end), four running sums (one chain of adds is the latency of an add per entry) */
static double mtp_sum_range(const double * p, int32_t begin, int32_t end) {
    double s[4] = { 0.0, 0.0, 0.0, 0.0 };
    int32_t j = begin;
    for (; j + 4 <= end; j += 4) {
        s[0] += p[j];
        s[1] += p[j + 1];
        s[2] += p[j + 2];
        s[3] += p[j + 3];
    }
    for (; j < end; ++j) {
        s[0] += p[j];
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* The index u in [0, 1) picks from the weights p[0..n) by the inverse CDF; never an entry of weight 0. The
   running sum skips whole blocks first, by their sums. */
#define MTP_DRAW_BLOCK 256
static int32_t mtp_round_draw(const double * p, int32_t n, double u) {
    const double target = u * mtp_sum_range(p, 0, n);
    double cum = 0.0;
    for (int32_t b = 0; b < n; b += MTP_DRAW_BLOCK) {
        const int32_t end = b + MTP_DRAW_BLOCK < n ? b + MTP_DRAW_BLOCK : n;
        const double s = mtp_sum_range(p, b, end);
        if (cum + s <= target && end < n) {
            cum += s;
            continue;
        }
        for (int32_t j = b; j < end; ++j) {
            cum += p[j];
            if (cum > target && p[j] > 0.0) {
                return j;
            }
        }
    }
    for (int32_t j = n - 1; j > 0; --j) { /* the target rounded up to the total */
        if (p[j] > 0.0) {
            return j;
        }
    }
    return 0;
}

/* One row's greedy pick: the raw argmax (the first of a tie), or the chain's highest logit (the lowest id). */
static int32_t mtp_round_greedy(const mtp_round * r, const float * row, const uint32_t * mask, int32_t * err) {
    if (r->mode == MTP_ROUND_ARGMAX && mask == NULL) {
        /* the first block holding the maximum, by the blocks' vectorized maxima, then its first index there */
        int32_t block = 0;
        const float best = mtp_row_max(row, r->n_vocab, &block);
        for (int32_t i = block * MTP_TOP_K_BLOCK; i < r->n_vocab; ++i) {
            if (row[i] == best) {
                return i;
            }
        }
        return block * MTP_TOP_K_BLOCK; /* a block of NaN: its first token, as any */
    }
    size_t size = 0;
    const llama_token_data * c = mtp_round_chain(r, row, mask, &size, err);
    if (c == NULL) {
        return -1;
    }
    size_t best = size;
    for (size_t j = 0; j < size; ++j) { /* a masked token (-inf) is never the pick */
        if (c[j].logit > -INFINITY && (best == size || c[j].logit > c[best].logit ||
                                       (c[j].logit == c[best].logit && c[j].id < c[best].id))) {
            best = j;
        }
    }
    if (best == size) {
        *err = MTP_ROUND_ERR_EMPTY;
        return -1;
    }
    return c[best].id;
}

static void mtp_round_emit(const mtp_round * r, int32_t token) {
    if (r->stateful) {
        llama_sampler_accept(r->chain, token);
    }
}

/* Verify drafts[0..n_rows-1) against rows[0..n_rows): row i is the target's prediction after the emitted
   tokens and drafts[0..i). Sampled: draft i is accepted with its probability (u[2 i] below it); on a
   rejection the token is drawn from the row's distribution without the draft (u[2 i + 1]); when every draft
   is accepted the bonus token is drawn from the last row (u[2 n_rows - 1]). Greedy: a draft is accepted where
   it is the row's pick; the first other pick follows. Every emitted token is heard by a stateful chain before
   the next row is read. u NULL: the numbers come from r->rng, u[2 i] and u[2 i + 1] drawn in that order.
   Returns the number of drafts accepted, the token after them in *out_token; or a negative enum
   mtp_round_status. */
static int32_t mtp_verify_round(mtp_round * r, const float * const * rows, int32_t n_rows,
                                const int32_t * drafts, const double * u, int32_t * out_token) {
    if (r == NULL || rows == NULL || n_rows < 1 || n_rows > MTP_ROUND_MAX_ROWS || out_token == NULL) {
        return MTP_ROUND_ERR_CHAIN;
    }
    double own[2 * MTP_ROUND_MAX_ROWS];
    if (r->mode == MTP_ROUND_SAMPLE && u == NULL) {
        for (int32_t i = 0; i < 2 * n_rows; ++i) {
            own[i] = mtp_round_uniform(r);
        }
        u = own;
    }
    int32_t err = 0;
    for (int32_t i = 0; i < n_rows; ++i) {
        const int last = i == n_rows - 1;
        const uint32_t * mask = r->masks != NULL ? r->masks + (size_t) i * r->mask_words : NULL;
        if (r->mode != MTP_ROUND_SAMPLE) {
            const int32_t tok = mtp_round_greedy(r, rows[i], mask, &err);
            if (tok < 0) {
                return err;
            }
            mtp_round_emit(r, tok);
            if (last || tok != drafts[i]) {
                *out_token = tok;
                return i;
            }
            continue;
        }
        size_t size = 0;
        llama_token_data * c = mtp_round_chain(r, rows[i], mask, &size, &err);
        if (c == NULL) {
            return err;
        }
        double total = 0.0;
        const int32_t n = mtp_round_distribution(r, c, size, &total);
        if (n < 0) {
            return n;
        }
        if (!last) {
            const int32_t * hit = (const int32_t *) bsearch(&drafts[i], r->ids, (size_t) n, sizeof(int32_t), mtp_cmp_i32);
            const double p_d = hit != NULL ? r->probs[hit - r->ids] / total : 0.0;
            if (p_d > 0.0 && u[2 * i] < p_d) {
                mtp_round_emit(r, drafts[i]);
                continue;
            }
            /* the residual norm(max(p - q, 0)) of a one-hot q: p without the draft */
            if (p_d > 0.0) {
                r->probs[hit - r->ids] = 0.0;
            }
        }
        const int32_t tok = r->ids[mtp_round_draw(r->probs, n, u[2 * i + 1])];
        mtp_round_emit(r, tok);
        *out_token = tok;
        return i;
    }
    return MTP_ROUND_ERR_CHAIN; /* not reached: the last row returns */
}

