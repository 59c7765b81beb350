#include "quality/niah.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "common/error.h"

namespace spillway {
namespace {

// splitmix64: tiny, fast and fully determined by the seed on every platform (std::
// distributions are not, and samples must be identical across machines and builds).
struct Rng {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    size_t below(size_t n) { return (size_t)(next() % n); }
    double unit() { return (double)(next() >> 11) / 9007199254740992.0; }
    template <size_t N>
    const char* pick(const std::array<const char*, N>& words) { return words[below(N)]; }
};

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b) {
    Rng r{seed ^ (a * 0x100000001b3ull) ^ (b << 32)};
    r.next();
    return r.next();
}

constexpr std::array<const char*, 48> kAdjectives = {
    "amber", "ancient", "brave", "brisk", "calm", "careful", "clever", "cobalt", "crimson",
    "curious", "distant", "eager", "early", "famous", "fragile", "gentle", "golden", "grand",
    "hidden", "hollow", "honest", "humble", "icy", "jolly", "lively", "loyal", "lucky", "mellow",
    "modern", "narrow", "noble", "quiet", "rapid", "rare", "restless", "rustic", "scarlet",
    "silent", "silver", "steady", "sturdy", "subtle", "swift", "tender", "vivid", "wandering",
    "wild", "wise"};
constexpr std::array<const char*, 48> kNouns = {
    "anchor", "badger", "bridge", "canyon", "castle", "cedar", "comet", "compass", "falcon",
    "feather", "fountain", "garden", "glacier", "harbor", "harvest", "island", "journey",
    "kettle", "ladder", "lantern", "meadow", "mirror", "monarch", "mountain", "orchard", "otter",
    "palace", "pebble", "pilot", "planet", "quarry", "rabbit", "raven", "river", "saddle",
    "sparrow", "spindle", "summit", "teacher", "thunder", "timber", "tower", "valley", "violin",
    "voyage", "walnut", "window", "zephyr"};

// Grammar for the essay haystack: reflective prose about work, places and ideas, varied
// enough that a model cannot trivially skip it, and entirely ours to ship.
constexpr std::array<const char*, 24> kSubjects = {
    "Most people who start something new", "A good teacher", "The best engineers I know",
    "Anyone who has moved to a new city", "Small companies", "Old river towns",
    "Writers who finish their books", "A craftsman with a good set of tools",
    "The founders of the early workshops", "Investors with long memories", "Children at play",
    "A careful reader", "Travellers on the northern roads", "Farmers in a dry year",
    "Students who ask too many questions", "The people who build bridges",
    "Musicians learning a hard piece", "Cities that grew around a harbor", "A patient gardener",
    "Most ambitious projects", "The first version of anything", "Doctors in small villages",
    "Sailors before the age of maps", "People who keep notebooks"};
constexpr std::array<const char*, 24> kPredicates = {
    "learn more from their mistakes than from their plans",
    "tend to underestimate how long the easy parts take",
    "discover that the real problem was not the one they set out to solve",
    "eventually notice that habits matter more than talent",
    "find that curiosity is a better guide than ambition",
    "depend on a few friends far more than they admit",
    "do their best work when nobody is watching",
    "rarely succeed by copying what worked somewhere else",
    "spend years on questions that later seem obvious",
    "benefit from constraints that looked like obstacles at first",
    "keep returning to the ideas they once dismissed",
    "have to unlearn as much as they learn",
    "measure progress in seasons rather than in days",
    "trust the evidence of their own hands",
    "change their minds more often than outsiders expect",
    "build slowly and then all at once",
    "waste less time when they write their reasoning down",
    "remember the weather of the year everything changed",
    "treat boredom as a signal rather than a verdict",
    "find the edges of a field more interesting than its center",
    "save their energy for the few decisions that matter",
    "notice patterns long before they can explain them",
    "owe more to luck than their stories suggest",
    "end up somewhere they could not have planned"};
constexpr std::array<const char*, 20> kConnectives = {
    "This is partly because", "The reason is simple:", "It helps to remember that",
    "In practice,", "Over time,", "What surprised me was that", "Strangely enough,",
    "As a rule,", "Looking back,", "For the same reason,", "Even so,", "In the long run,",
    "More often than not,", "At first glance this seems odd, but", "History suggests that",
    "One consequence is that", "It follows that", "In most cases,", "On reflection,",
    "Curiously,"};
constexpr std::array<const char*, 20> kObservations = {
    "the work itself teaches what no manual can",
    "the cost of starting is always smaller than it looks",
    "a plain explanation usually beats a clever one",
    "good tools make slow people fast and fast people careless",
    "the map is never the territory",
    "most of the value arrives near the end",
    "small improvements compound like interest",
    "the loudest opinion is rarely the best informed",
    "the simplest question often has the longest answer",
    "a quiet morning is worth more than a busy week",
    "every shortcut eventually sends its bill",
    "people remember stories long after they forget numbers",
    "the second attempt is where the learning happens",
    "distance makes old problems look smaller and new ones larger",
    "the details decide whether an idea survives",
    "nobody can see the whole picture from inside it",
    "patience is a form of speed",
    "a good question is already half of the answer",
    "the river does not care who built the bridge",
    "the difference between luck and skill shrinks with practice"};

std::string essay_sentence(Rng& rng) {
    switch (rng.below(4)) {
        case 0:
            return std::string(rng.pick(kSubjects)) + " " + rng.pick(kPredicates) + ".";
        case 1:
            return std::string(rng.pick(kConnectives)) + " " + rng.pick(kObservations) + ".";
        case 2: {
            std::string s = rng.pick(kSubjects);
            return s + " " + rng.pick(kPredicates) + ", and " + rng.pick(kObservations) + ".";
        }
        default: {
            std::string obs = rng.pick(kObservations);
            obs[0] = (char)std::toupper((unsigned char)obs[0]);
            return "I think " + std::string(rng.pick(kObservations)) + ". " + obs + ".";
        }
    }
}

std::string word_key(Rng& rng) { return std::string(rng.pick(kAdjectives)) + "-" + rng.pick(kNouns); }
std::string number_value(Rng& rng) { return std::to_string(1000000 + rng.below(9000000)); }
std::string uuid_value(Rng& rng) {
    uint64_t a = rng.next(), b = rng.next();
    char buf[40];
    std::snprintf(buf, sizeof buf, "%08x-%04x-4%03x-%04x-%012llx", (unsigned)(a >> 32), (unsigned)(a >> 16) & 0xffff,
                  (unsigned)a & 0xfff, (unsigned)(0x8000 | ((b >> 48) & 0x3fff)),
                  (unsigned long long)(b & 0xffffffffffffull));
    return buf;
}

struct TaskShape {
    enum Haystack { noise, essay, needles } haystack;
    bool uuid_keys, uuid_values;
    int n_keys;     // needles with distinct keys (the first is queried unless multiquery)
    int n_values;   // values per queried key
    int n_queries;  // keys asked for
};

TaskShape task_shape(NiahTask task) {
    switch (task) {
        case NiahTask::single_1: return {TaskShape::noise, false, false, 1, 1, 1};
        case NiahTask::single_2: return {TaskShape::essay, false, false, 1, 1, 1};
        case NiahTask::single_3: return {TaskShape::essay, false, true, 1, 1, 1};
        case NiahTask::multikey_1: return {TaskShape::essay, false, false, 4, 1, 1};
        case NiahTask::multikey_2: return {TaskShape::needles, false, false, 1, 1, 1};
        case NiahTask::multikey_3: return {TaskShape::needles, true, true, 1, 1, 1};
        case NiahTask::multivalue: return {TaskShape::essay, false, false, 1, 4, 1};
        case NiahTask::multiquery: return {TaskShape::essay, false, false, 4, 1, 4};
    }
    fail("unknown niah task");
}

struct Needle {
    std::string key, value;
};

std::string needle_sentence(const Needle& n, const char* value_kind) {
    return "One of the special magic " + std::string(value_kind) + " for " + n.key + " is: " + n.value + ".";
}

std::string join_keys(const std::vector<std::string>& keys) {
    std::string out;
    for (size_t i = 0; i < keys.size(); ++i) {
        if (i) out += (i + 1 == keys.size()) ? " and " : ", ";
        out += keys[i];
    }
    return out;
}

}  // namespace

const char* niah_task_name(NiahTask task) {
    switch (task) {
        case NiahTask::single_1: return "niah_single_1";
        case NiahTask::single_2: return "niah_single_2";
        case NiahTask::single_3: return "niah_single_3";
        case NiahTask::multikey_1: return "niah_multikey_1";
        case NiahTask::multikey_2: return "niah_multikey_2";
        case NiahTask::multikey_3: return "niah_multikey_3";
        case NiahTask::multivalue: return "niah_multivalue";
        case NiahTask::multiquery: return "niah_multiquery";
    }
    return "?";
}

std::vector<NiahTask> all_niah_tasks() {
    return {NiahTask::single_1,   NiahTask::single_2,   NiahTask::single_3,   NiahTask::multikey_1,
            NiahTask::multikey_2, NiahTask::multikey_3, NiahTask::multivalue, NiahTask::multiquery};
}

std::optional<NiahTask> niah_task_from_name(const std::string& name) {
    for (NiahTask t : all_niah_tasks()) {
        std::string full = niah_task_name(t);
        if (name == full || name == full.substr(5)) return t;
    }
    return std::nullopt;
}

std::vector<double> niah_depths(uint32_t n) {
    if (n == 0) return {};
    if (n == 1) return {0.5};
    std::vector<double> d(n);
    for (uint32_t i = 0; i < n; ++i) d[i] = (double)i / (double)(n - 1);
    return d;
}

double niah_score(const std::string& answer, const std::vector<std::string>& expected) {
    if (expected.empty()) return 0.0;
    auto lower = [](std::string s) {
        std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
        return s;
    };
    std::string a = lower(answer);
    int hits = 0;
    for (const std::string& e : expected)
        if (a.find(lower(e)) != std::string::npos) ++hits;
    return 100.0 * hits / (double)expected.size();
}

std::string essay_haystack(uint64_t seed, size_t min_chars) {
    Rng rng{mix_seed(seed, 0xe55a, 0)};
    std::string text;
    int sentences_in_paragraph = 0;
    while (text.size() < min_chars) {
        if (!text.empty()) text += sentences_in_paragraph == 0 ? "\n\n" : " ";
        text += essay_sentence(rng);
        sentences_in_paragraph = (sentences_in_paragraph + 1) % (4 + (int)rng.below(4));
    }
    return text;
}

std::vector<std::string> niah_key_adjectives() { return {kAdjectives.begin(), kAdjectives.end()}; }
std::vector<std::string> niah_key_nouns() { return {kNouns.begin(), kNouns.end()}; }

NiahSample make_niah_sample(const NiahRequest& request, const TokenCounter& count_tokens) {
    if (!(request.depth >= 0.0 && request.depth <= 1.0))
        fail("niah: depth " + std::to_string(request.depth) + " is outside [0, 1]");
    const TaskShape shape = task_shape(request.task);
    Rng rng{mix_seed(request.seed, (uint64_t)request.task, request.target_tokens)};
    const char* value_kind = shape.uuid_values ? "uuids" : "numbers";

    auto make_key = [&] { return shape.uuid_keys ? uuid_value(rng) : word_key(rng); };
    auto make_value = [&] { return shape.uuid_values ? uuid_value(rng) : number_value(rng); };

    // Needles: n_keys distinct keys; the queried keys carry n_values values each.
    std::vector<Needle> needles;
    std::vector<std::string> keys;
    while ((int)keys.size() < shape.n_keys) {
        std::string k = make_key();
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
    std::vector<std::string> expected;
    for (int k = 0; k < shape.n_keys; ++k) {
        bool queried = k < shape.n_queries;
        int n_values = queried ? shape.n_values : 1;
        for (int v = 0; v < n_values; ++v) {
            Needle n{keys[k], make_value()};
            if (queried) expected.push_back(n.value);
            needles.push_back(n);
        }
    }
    std::vector<std::string> queried_keys(keys.begin(), keys.begin() + shape.n_queries);
    const std::string query = join_keys(queried_keys);

    const std::string intro = "Some special magic " + std::string(value_kind) +
                              " are hidden within the following text. Make sure to memorize it. I will quiz you about the " +
                              value_kind + " afterwards.\n";
    const std::string question = "\nWhat are all the special magic " + std::string(value_kind) + " for " + query +
                                 " mentioned in the provided text?";
    NiahSample sample;
    sample.task = request.task;
    sample.target_tokens = request.target_tokens;
    sample.depth = request.depth;
    sample.expected = expected;
    sample.answer_prefix = " The special magic " + std::string(value_kind) + " for " + query +
                           " mentioned in the provided text are";

    // Haystack units (sentences); needle-haystacks are made of needles for other keys.
    Rng hay_rng{mix_seed(request.seed, 0x4a7, (uint64_t)request.task)};
    auto haystack_unit = [&](size_t i) -> std::string {
        switch (shape.haystack) {
            case TaskShape::noise:
                return "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
            case TaskShape::essay: return essay_sentence(hay_rng);
            case TaskShape::needles: {
                Needle n;
                do {
                    n.key = shape.uuid_keys ? uuid_value(hay_rng) : word_key(hay_rng);
                } while (std::find(keys.begin(), keys.end(), n.key) != keys.end());
                n.value = shape.uuid_values ? uuid_value(hay_rng) : number_value(hay_rng);
                (void)i;
                return needle_sentence(n, value_kind);
            }
        }
        return {};
    };

    // Needle positions as fractions: the first queried needle at the requested depth, the
    // rest spread deterministically so distractors are not all clustered with it.
    std::vector<double> needle_depths(needles.size());
    for (size_t i = 0; i < needles.size(); ++i) needle_depths[i] = i == 0 ? request.depth : rng.unit();

    // Depth is a fraction of the haystack's tokens, as in RULER (sentences differ in length, so
    // a fraction of the sentence count drifts by a few percent): each unit's tokens are counted
    // once, and a needle goes to the unit boundary nearest its share of the total.
    std::vector<std::string> units;
    std::vector<size_t> unit_tokens;
    auto assemble = [&](size_t n_units) {
        while (units.size() < n_units) {
            units.push_back(haystack_unit(units.size()));
            unit_tokens.push_back(count_tokens(units.back()));
        }
        std::vector<size_t> tokens_before(n_units + 1, 0);
        for (size_t u = 0; u < n_units; ++u) tokens_before[u + 1] = tokens_before[u] + unit_tokens[u];
        std::vector<std::vector<const Needle*>> at(n_units + 1);
        for (size_t i = 0; i < needles.size(); ++i) {
            const double target = needle_depths[i] * (double)tokens_before[n_units];
            size_t u = (size_t)(std::lower_bound(tokens_before.begin(), tokens_before.end(), target) -
                                tokens_before.begin());
            if (u > n_units) u = n_units;
            if (u > 0 && target - (double)tokens_before[u - 1] < (double)tokens_before[u] - target) --u;
            at[u].push_back(&needles[i]);
        }
        std::string context;
        for (size_t u = 0; u <= n_units; ++u) {
            for (const Needle* n : at[u]) context += (context.empty() ? "" : " ") + needle_sentence(*n, value_kind);
            if (u < n_units) context += (context.empty() ? "" : " ") + units[u];
        }
        return intro + context + question;
    };

    auto tokens_of = [&](size_t n_units) { return count_tokens(assemble(n_units) + sample.answer_prefix); };
    if (tokens_of(0) > request.target_tokens)
        fail("niah: target of " + std::to_string(request.target_tokens) + " tokens cannot hold " +
             niah_task_name(request.task) + "'s instruction, needles and question (" +
             std::to_string(tokens_of(0)) + " tokens)");
    // Largest haystack that fits: grow geometrically, then bisect.
    size_t lo = 0, hi = 1;
    while (tokens_of(hi) <= request.target_tokens) {
        lo = hi;
        hi *= 2;
    }
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        (tokens_of(mid) <= request.target_tokens ? lo : hi) = mid;
    }
    sample.prompt = assemble(lo);
    sample.prompt_tokens = (uint32_t)tokens_of(lo);
    return sample;
}

}  // namespace spillway
