// The streamed KV spill (engine/cuda/kv_spill.h) against the unspilled cache: the same tier
// with and without a spill must give the same greedy tokens and logits within a stated
// tolerance. Spill sizes from one cell to all but one, several chunks per layer, prefill
// chunks that cross the resident boundary, every KV tier, on make-model's tiny preset and
// (memory permitting) the Qwen2.5-14B shape with random weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "engine/cpu/cpu_model.h"
#include "engine/cpu/sampler.h"
#include "engine/cuda/cuda_forward.h"
#include "engine/cuda/cuda_generate.h"
#include "engine/cuda/cuda_model.h"
#include "model/make_model.h"
#include "cuda_test_models.h"
#include "quality/cuda_logits_backend.h"

namespace spillway {
namespace {

using cuda_test::rel_error;

using Tiny = cuda_test::TinyModel;

Tiny& tiny() { return cuda_test::tiny_model(GgmlType::Q8_0, 23); }

const std::pair<KvType, KvType> kTiers[] = {{KvType::f16, KvType::f16},   {KvType::q8_0, KvType::q8_0},
                                            {KvType::q4_0, KvType::q4_0}, {KvType::f16, KvType::q4_0},
                                            {KvType::q8_0, KvType::f16}};

std::string tier_name(KvType k, KvType v) { return std::string(kv_type_name(k)) + "/" + kv_type_name(v); }

// Spilled vs unspilled differ only in how attention's sum is split and merged (f32 merges,
// and the decode kernel rounds P to f16 relative to each partial's own max), and, from layer
// 1 on, in quantization roundings those tiny differences flip. Tolerances on the worst row's
// ||a - b|| / ||b||; measured values are printed by the tests.
double tolerance(KvType k, KvType v) {
    if (k == KvType::q4_0 || v == KvType::q4_0) return 5e-2;
    if (k == KvType::q8_0 || v == KvType::q8_0) return 1e-2;
    return 2e-3;
}

// Poisons every byte of the cache, VRAM window, host tail and staging: a cell the engine
// reads before writing it turns into NaN logits.
void poison_cache(CudaKvCache& c) {
    SPILLWAY_CUDA_CHECK(cudaMemset(c.arena.data(), 0xFF, c.arena.bytes()));
    if (!c.spill) return;
    std::memset(c.spill->host.data(), 0xFF, c.spill->host.bytes());
    SPILLWAY_CUDA_CHECK(cudaMemset(c.spill->staging.data(), 0xFF, c.spill->staging.bytes()));
}

struct GreedyRun {
    std::vector<float> prefill;              // [prompt][V]: every prompt row
    std::vector<int32_t> tokens;             // greedy tokens
    std::vector<std::vector<float>> rows;    // rows[i]: the logits token i was chosen from
};

struct SpillConfig {
    uint32_t resident = UINT32_MAX;
    uint32_t chunk_cells = 0;
};

// Prefill `prompt` in chunks of `batch` (all logits), then `steps` greedy tokens through the
// graph decode path, in a cache of exactly the cells this uses (prompt + steps - 1).
GreedyRun greedy_run(const CudaModel& m, const std::vector<int32_t>& prompt, uint32_t steps, KvType kt, KvType vt,
                     SpillConfig spill, uint32_t batch) {
    // Every cell is used: the last step decodes at P + steps - 2.
    const uint32_t V = m.spec.n_vocab, P = (uint32_t)prompt.size(), n_ctx = P + steps - 1;
    CudaKvCache cache = make_cuda_kv_cache(m, n_ctx, kt, vt, spill.resident, spill.chunk_cells);
    poison_cache(cache);
    CudaForwardState st;
    init_cuda_forward_state(st, m, batch, true, n_ctx);
    GreedyRun r;
    r.prefill.resize((size_t)P * V);
    uint32_t last_n = 0;
    for (uint32_t pos = 0; pos < P; pos += batch) {
        const uint32_t n = std::min(batch, P - pos);
        forward_cuda_tokens(m, cache, st, prompt.data() + pos, n, pos);
        SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(r.prefill.data() + (size_t)pos * V, st.logits.data(), (size_t)n * V * 4,
                                            cudaMemcpyDeviceToHost, st.stream));
        last_n = n;
    }
    argmax_logits_cuda(st, V, last_n - 1);
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
    const int32_t* host_token = static_cast<const int32_t*>(st.host_token.data());
    r.tokens.push_back(*host_token);
    r.rows.emplace_back(r.prefill.end() - V, r.prefill.end());
    std::vector<float> row(V);
    for (uint32_t i = 1; i < steps; ++i) {
        decode_step_cuda(m, cache, st, P + i - 1, true, true);
        SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(row.data(), st.logits.data(), (size_t)V * 4, cudaMemcpyDeviceToHost,
                                            st.stream));
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
        r.tokens.push_back(*host_token);
        r.rows.push_back(row);
    }
    return r;
}

double worst_prefill_row(const std::vector<float>& a, const std::vector<float>& b, uint32_t V) {
    double worst = 0;
    for (size_t r = 0; r < a.size() / V; ++r) worst = std::max(worst, rel_error(a.data() + r * V, b.data() + r * V, V));
    return worst;
}

// Compares a spilled run with the unspilled reference: logits up to the first divergent
// token within `tol`; a divergence only where the reference's top-2 margin is within twice
// the two runs' largest logit difference on that very row (the two are then a coin flip).
void expect_same_greedy(const GreedyRun& got, const GreedyRun& ref, uint32_t V, double tol, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(cuda_test::count_nan(got.prefill), 0u);
    ASSERT_EQ(got.tokens.size(), ref.tokens.size());
    const double pre = worst_prefill_row(got.prefill, ref.prefill, V);
    size_t first_diff = got.tokens.size();
    for (size_t i = 0; i < got.tokens.size() && first_diff == got.tokens.size(); ++i)
        if (got.tokens[i] != ref.tokens[i]) first_diff = i;
    double dec = 0;
    for (size_t i = 0; i < std::min(first_diff + 1, got.rows.size()); ++i)
        dec = std::max(dec, rel_error(got.rows[i].data(), ref.rows[i].data(), V));
    std::printf("[ %s ] worst row rel. diff: prefill %.2e, decode %.2e; tokens %s\n", what.c_str(), pre, dec,
                first_diff == got.tokens.size() ? "identical" : ("diverge at " + std::to_string(first_diff)).c_str());
    EXPECT_LE(pre, tol);
    EXPECT_LE(dec, tol);
    if (first_diff < got.tokens.size()) {
        const std::vector<float>& g = got.rows[first_diff];
        const std::vector<float>& c = ref.rows[first_diff];
        std::vector<float> sorted = c;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        float max_delta = 0;
        for (uint32_t v = 0; v < V; ++v) max_delta = std::max(max_delta, std::fabs(g[v] - c[v]));
        std::printf("    divergence: reference top-2 margin %.3g, max |logit delta| %.3g\n", sorted[0] - sorted[1],
                    max_delta);
        EXPECT_LE(sorted[0] - sorted[1], 2.0f * max_delta) << "step " << first_diff;
    }
}

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, uint32_t vocab) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = (int32_t)(rng() % vocab);
    return t;
}

TEST(CudaSpill, FullResidentWindowIsTheUnspilledCache) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    std::mt19937 rng(cuda_test::fresh_seed());
    Tiny& t = tiny();
    const auto prompt = random_tokens(rng, 13, t.cpu.spec.n_vocab);
    const uint32_t steps = 40, n_ctx = 13 + steps - 1;
    for (uint32_t resident : {n_ctx, n_ctx + 5, UINT32_MAX}) {
        CudaKvCache c = make_cuda_kv_cache(*t.gpu, n_ctx, KvType::q8_0, KvType::f16, resident);
        EXPECT_EQ(c.spill, nullptr);
        EXPECT_EQ(c.n_resident, n_ctx);
        EXPECT_EQ(cuda_kv_staging_bytes(c), 0u);
        EXPECT_EQ(cuda_kv_spilled_bytes(c), 0u);
    }
    const GreedyRun a = greedy_run(*t.gpu, prompt, steps, KvType::q8_0, KvType::f16, {n_ctx, 0}, 4);
    const GreedyRun b = greedy_run(*t.gpu, prompt, steps, KvType::q8_0, KvType::f16, {}, 4);
    EXPECT_EQ(rel_error(a.prefill, b.prefill), 0.0);
    EXPECT_EQ(a.tokens, b.tokens);
    for (size_t i = 0; i < a.rows.size(); ++i) EXPECT_EQ(rel_error(a.rows[i], b.rows[i]), 0.0) << "row " << i;
}

TEST(CudaSpill, RejectsAnEmptyResidentWindow) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    Tiny& t = tiny();
    EXPECT_THROW(make_cuda_kv_cache(*t.gpu, 64, KvType::f16, KvType::f16, 0), Error);
}

// An absurd context is refused in the user's terms (cells, MiB needed and free, what to change)
// before cudaMalloc's bare "out of memory", and the GPU stays usable.
TEST(CudaSpill, KvCacheLargerThanVramIsRefusedInTheUsersTerms) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    Tiny& t = tiny();
    try {
        CudaKvCache c = make_cuda_kv_cache(*t.gpu, 4000000000u, KvType::f16, KvType::f16);
        ADD_FAILURE() << "a cache of 4e9 cells was allocated";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("4000000000 resident cells"), std::string::npos) << what;
        EXPECT_NE(what.find("MiB are free"), std::string::npos) << what;
    }
    CudaKvCache c = make_cuda_kv_cache(*t.gpu, 64, KvType::f16, KvType::f16);
    EXPECT_EQ(c.n_resident, 64u);
}

TEST(CudaSpill, SpillSizes) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    Tiny& t = tiny();
    const uint32_t n_ctx = 100;
    CudaKvCache c = make_cuda_kv_cache(*t.gpu, n_ctx, KvType::f16, KvType::q4_0, 99);
    ASSERT_NE(c.spill, nullptr);
    EXPECT_EQ(c.spill->n_tail, 1u);
    EXPECT_EQ(c.spill->chunk_cells, 1u);
    EXPECT_EQ(cuda_kv_spilled_bytes(c), (c.k_row_bytes + c.v_row_bytes) * t.cpu.spec.n_layer);
    EXPECT_GE(cuda_kv_staging_bytes(c), 2 * (c.k_row_bytes + c.v_row_bytes));
    CudaKvCache d = make_cuda_kv_cache(*t.gpu, n_ctx, KvType::f16, KvType::f16, 1, 16);
    EXPECT_EQ(d.spill->n_tail, 99u);
    EXPECT_EQ(d.spill->chunk_cells, 16u);
}

// 256 greedy steps of every tier: spill of one cell, of half, of all but one cell, and half
// in chunks of 7 cells (several chunks per layer, the ring wrapping across layers).
TEST(CudaSpill, GreedyDecodeMatchesUnspilledForEveryTier) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Tiny& t = tiny();
    const uint32_t V = t.cpu.spec.n_vocab, steps = 256;
    const auto prompt = random_tokens(rng, 9, V);
    const uint32_t n_ctx = (uint32_t)prompt.size() + steps - 1;  // greedy_run's cache
    const SpillConfig configs[] = {{n_ctx - 1, 0}, {n_ctx / 2, 0}, {1, 0}, {n_ctx / 2, 7}};
    for (const auto& [kt, vt] : kTiers) {
        const GreedyRun ref = greedy_run(*t.gpu, prompt, steps, kt, vt, {}, 4);
        for (const SpillConfig& sc : configs) {
            const GreedyRun got = greedy_run(*t.gpu, prompt, steps, kt, vt, sc, 4);
            expect_same_greedy(got, ref, V, tolerance(kt, vt),
                               tier_name(kt, vt) + " resident " + std::to_string(sc.resident) + "/" +
                                   std::to_string(n_ctx) + " chunk " + std::to_string(sc.chunk_cells));
        }
    }
}

// Prefill chunks of 16 that start before, at and after the resident boundary, new cells
// going to VRAM and the tail in the same chunk, and the tail read back by later chunks.
TEST(CudaSpill, PrefillAcrossTheBoundary) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    const uint32_t seed = cuda_test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Tiny& t = tiny();
    const uint32_t V = t.cpu.spec.n_vocab, steps = 24;
    const auto prompt = random_tokens(rng, 70, V);
    const SpillConfig configs[] = {{1, 0}, {30, 0}, {30, 5}, {32, 0}, {69, 0}};
    for (const auto& [kt, vt] : kTiers) {
        const GreedyRun ref = greedy_run(*t.gpu, prompt, steps, kt, vt, {}, 16);
        for (const SpillConfig& sc : configs) {
            const GreedyRun got = greedy_run(*t.gpu, prompt, steps, kt, vt, sc, 16);
            expect_same_greedy(got, ref, V, tolerance(kt, vt),
                               tier_name(kt, vt) + " prefill, resident " + std::to_string(sc.resident) + " chunk " +
                                   std::to_string(sc.chunk_cells));
        }
    }
}

// generate_cuda with resident_cells: the `run --device cuda` path and its stats.
TEST(CudaSpill, GenerateReportsSpillAndMatches) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    // A fixed prompt (SPILLWAY_TEST_SEED overrides): 64 greedy tokens compared exactly. With
    // fresh random prompts this flipped once in ~50 runs (session 17): the spilled path rounds
    // its attention differently and a random prompt can hit a near tie. Random prompts with a
    // margin-judged comparison are the job of the tests above
    // (GreedyDecodeMatchesUnspilledForEveryTier, PrefillAcrossTheBoundary).
    const uint32_t seed = std::getenv("SPILLWAY_TEST_SEED") ? cuda_test::fresh_seed() : 20261201u;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Tiny& t = tiny();
    const auto prompt = random_tokens(rng, 11, t.cpu.spec.n_vocab);
    SamplerConfig greedy;
    greedy.temperature = 0;
    auto generate = [&](uint32_t resident, std::vector<int32_t>& tokens) {
        CudaGenerateOptions o;
        o.n_ctx = 80;
        o.batch = 8;
        o.resident_cells = resident;
        o.show_progress = false;
        return generate_cuda(t.cpu, prompt, 64, greedy, o, [&](int32_t tok) {
            tokens.push_back(tok);
            return true;
        });
    };
    std::vector<int32_t> a, b;
    const CudaGenerateStats sa = generate(UINT32_MAX, a);
    const CudaGenerateStats sb = generate(40, b);
    EXPECT_EQ(sa.spilled_bytes, 0u);
    EXPECT_EQ(sa.staging_bytes, 0u);
    const uint64_t cell = (kv_row_bytes(KvType::f16, 2 * 64) * 2) * t.cpu.spec.n_layer;
    EXPECT_EQ(sb.spilled_bytes, cell * 40);
    EXPECT_GT(sb.staging_bytes, 0u);
    EXPECT_EQ(a, b);  // tiny's margins are wide; a flip here would show in the tests above first
}

// The gate's CUDA LogitsBackend: spilled and unspilled agree (all rows of a chunked prefill,
// then single tokens), and the spilled one reports its pinned tail.
TEST(CudaSpill, LogitsBackendSpilledMatchesResident) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    std::mt19937 rng(cuda_test::fresh_seed());
    Tiny& t = tiny();
    const uint32_t V = t.cpu.spec.n_vocab, n_ctx = 48;
    const GateKv kv{{KvType::f16, KvType::f16}, false};
    auto resident = make_cuda_logits_backend(t.cpu, kv, n_ctx, UINT32_MAX, 16);
    auto spilled = make_cuda_logits_backend(t.cpu, kv, n_ctx, 20, 16);
    EXPECT_EQ(resident->spilled_bytes(), 0u);
    EXPECT_EQ(spilled->spilled_bytes(), kv_row_bytes(KvType::f16, 2 * 64) * 2 * t.cpu.spec.n_layer * (n_ctx - 20));
    const auto prompt = random_tokens(rng, 40, V);
    const float* a = resident->eval(prompt.data(), 40, true);
    const std::vector<float> ref(a, a + (size_t)40 * V);
    const float* b = spilled->eval(prompt.data(), 40, true);
    EXPECT_LE(rel_error(b, ref.data(), (size_t)40 * V), tolerance(KvType::f16, KvType::f16));
    for (uint32_t i = 0; i < 5; ++i) {  // decode steps past the window
        const int32_t tok = (int32_t)(rng() % V);
        const float* ra = resident->eval(&tok, 1, false);
        const std::vector<float> row(ra, ra + V);
        const float* rb = spilled->eval(&tok, 1, false);
        EXPECT_LE(rel_error(rb, row.data(), V), tolerance(KvType::f16, KvType::f16)) << "step " << i;
        ASSERT_EQ(cuda_test::count_nan(row), 0u);
    }
    EXPECT_EQ(spilled->position(), 45u);
    EXPECT_THROW(make_cuda_logits_backend(t.cpu, GateKv{{}, true}, n_ctx), Error);
}

// The Qwen2.5-14B shape (48 layers, 40/8 heads of 128) with random Q8_0 weights: a cache
// filled to depth 3000, copied into a spilled cache (resident 1000, chunks of 512 cells),
// and 256 greedy steps from the same state through both (the tail grows from 2000 to 2256
// cells across a chunk edge, every new cell written back to the pinned tail).
TEST(CudaSpill, Qwen14BShapeMatchesUnspilled) {
    SPILLWAY_SKIP_WITHOUT_GPU();
    SPILLWAY_SKIP_WITHOUT_FREE_VRAM_GIB(40);
    const CudaModel m = make_synthetic_cuda_model("qwen2.5-14b", GgmlType::Q8_0, 5);
    const uint32_t V = m.spec.n_vocab, depth = 3000, steps = 256, n_ctx = depth + steps + 1;
    for (const auto& [kt, vt] : {std::pair{KvType::f16, KvType::f16}, std::pair{KvType::q8_0, KvType::q8_0}}) {
        CudaForwardState st;
        init_cuda_forward_state(st, m, 1, false, n_ctx);
        CudaKvCache full = make_cuda_kv_cache(m, n_ctx, kt, vt);
        fill_cuda_kv_cache_random(full, 77, st.stream);
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
        CudaKvCache spilled = make_cuda_kv_cache(m, n_ctx, kt, vt, 1000, 512);
        poison_cache(spilled);
        for (uint32_t l = 0; l < m.spec.n_layer; ++l) {
            const uint32_t r = spilled.n_resident, tail = depth - r;
            SPILLWAY_CUDA_CHECK(cudaMemcpy(spilled.k[l], full.k[l], r * full.k_row_bytes, cudaMemcpyDeviceToDevice));
            SPILLWAY_CUDA_CHECK(cudaMemcpy(spilled.v[l], full.v[l], r * full.v_row_bytes, cudaMemcpyDeviceToDevice));
            SPILLWAY_CUDA_CHECK(cudaMemcpy(spilled.spill->host_k[l], full.k[l] + r * full.k_row_bytes,
                                           tail * full.k_row_bytes, cudaMemcpyDeviceToHost));
            SPILLWAY_CUDA_CHECK(cudaMemcpy(spilled.spill->host_v[l], full.v[l] + r * full.v_row_bytes,
                                           tail * full.v_row_bytes, cudaMemcpyDeviceToHost));
        }
        auto run = [&](CudaKvCache& cache, std::vector<int32_t>& tokens, std::vector<std::vector<float>>& rows) {
            const int32_t first = 7;
            SPILLWAY_CUDA_CHECK(cudaMemcpy(st.next_token.data(), &first, 4, cudaMemcpyHostToDevice));
            std::vector<float> row(V);
            for (uint32_t i = 0; i < steps; ++i) {
                decode_step_cuda(m, cache, st, depth + i, true, true);
                SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(row.data(), st.logits.data(), (size_t)V * 4,
                                                    cudaMemcpyDeviceToHost, st.stream));
                SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st.stream));
                tokens.push_back(*static_cast<const int32_t*>(st.host_token.data()));
                rows.push_back(row);
            }
        };
        GreedyRun a, b;
        run(full, b.tokens, b.rows);
        run(spilled, a.tokens, a.rows);
        // The prefill rows are empty here (the cache was filled directly).
        expect_same_greedy(a, b, V, tolerance(kt, vt), "qwen2.5-14b shape " + tier_name(kt, vt));
    }
}

}  // namespace
}  // namespace spillway
