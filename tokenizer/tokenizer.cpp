#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>

#include "common/error.h"
#include "gguf/gguf.h"
#include "tokenizer/unicode.h"

namespace spillway {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // ▁ U+2581

// One symbol of a word being merged: a token (byte BPE) or a byte range (sentencepiece),
// linked to its live neighbours. Merging keeps the left symbol and kills the right one.
struct Symbol {
    int32_t id;     // current token (byte BPE)
    uint32_t start; // byte range in the text (sentencepiece)
    uint32_t end;
    int32_t prev;
    int32_t next;
};

// A candidate merge of symbols[left] with its right neighbour. Entries go stale when
// either side changes; they are checked when popped instead of being removed.
struct Candidate {
    float priority;  // larger first
    int32_t left;
    int32_t right;
    uint32_t left_end;   // validates the left symbol has not grown since
    uint32_t right_end;  // validates the right symbol has not grown since
    bool operator<(const Candidate& other) const {
        // std::priority_queue pops the largest: highest priority, then leftmost.
        if (priority != other.priority) return priority < other.priority;
        return left > other.left;
    }
};

}  // namespace

Tokenizer::Tokenizer(const GgufHeader& header) : Tokenizer(load_vocab(header)) {}

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
    for (int32_t id = 0; id < vocab_.size(); ++id) {
        if (!vocab_.is_matched_in_text(id)) continue;
        const std::string& text = vocab_.tokens[id];
        if (text.empty()) continue;
        special_by_first_byte_[static_cast<uint8_t>(text[0])].push_back(id);
    }
    for (auto& bucket : special_by_first_byte_) {
        std::stable_sort(bucket.begin(), bucket.end(), [&](int32_t a, int32_t b) {
            return vocab_.tokens[a].size() > vocab_.tokens[b].size();
        });
    }
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
    return id >= 0 && (id == vocab_.eos || id == vocab_.eot);
}

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text, bool parse_special) const {
    std::vector<Fragment> fragments;
    size_t text_start = 0;
    for (size_t i = 0; i < text.size();) {
        int32_t found = -1;
        for (int32_t id : special_by_first_byte_[static_cast<uint8_t>(text[i])]) {
            // Control and unknown tokens are only honoured when asked; user-defined always.
            if (!parse_special && vocab_.types[id] != TokenType::user_defined) continue;
            const std::string& token = vocab_.tokens[id];
            if (text.compare(i, token.size(), token) == 0) {
                found = id;
                break;
            }
        }
        if (found < 0) {
            ++i;
            continue;
        }
        if (i > text_start) fragments.push_back({false, -1, text.substr(text_start, i - text_start)});
        fragments.push_back({true, found, {}});
        i += vocab_.tokens[found].size();
        text_start = i;
    }
    if (text_start < text.size()) fragments.push_back({false, -1, text.substr(text_start)});
    return fragments;
}

std::vector<int32_t> Tokenizer::encode(std::string_view raw_text, const EncodeOptions& options) const {
    std::string sanitized = sanitize_utf8(raw_text);
    std::string_view text = sanitized;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (options.add_special && vocab_.add_bos) out.push_back(vocab_.bos);

    bool after_boundary = true;  // at the start or right after a special token
    for (const Fragment& fragment : split_special(text, options.parse_special)) {
        if (fragment.is_token) {
            out.push_back(fragment.id);
            after_boundary = true;
            continue;
        }
        if (vocab_.kind == VocabKind::byte_bpe) {
            encode_byte_bpe(fragment.text, out);
        } else {
            // Like llama.cpp and HF's legacy Llama tokenizer: every text fragment that
            // starts the input or follows a special token gets the ▁ prefix.
            encode_sentencepiece(fragment.text, vocab_.add_space_prefix && after_boundary, out);
        }
        after_boundary = false;
    }
    if (options.add_special && vocab_.add_eos) out.push_back(vocab_.eos);
    return out;
}

void Tokenizer::encode_byte_bpe(std::string_view text, std::vector<int32_t>& out) const {
    // Words repeat a lot in real text; merging each distinct word once keeps long inputs fast.
    std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache;  // word -> range in `out`
    std::vector<Symbol> symbols;
    std::priority_queue<Candidate> queue;
    std::string mapped;

    auto push_candidate = [&](int32_t left) {
        int32_t right = symbols[left].next;
        if (left < 0 || right < 0) return;
        uint64_t key = (static_cast<uint64_t>(symbols[left].id) << 32) | static_cast<uint32_t>(symbols[right].id);
        auto it = vocab_.merges.find(key);
        if (it == vocab_.merges.end()) return;
        queue.push({-static_cast<float>(it->second.rank), left, right,
                    static_cast<uint32_t>(symbols[left].id), static_cast<uint32_t>(symbols[right].id)});
    };

    for (std::string_view word : pretokenize(text, vocab_.pre)) {
        if (auto hit = cache.find(word); hit != cache.end()) {
            auto [begin, count] = hit->second;
            for (size_t k = 0; k < count; ++k) out.push_back(out[begin + k]);
            continue;
        }
        size_t begin = out.size();
        if (vocab_.ignore_merges) {
            mapped.clear();
            for (char c : word) append_utf8(mapped, byte_to_codepoint(static_cast<uint8_t>(c)));
            if (auto it = vocab_.ids.find(std::string_view(mapped)); it != vocab_.ids.end()) {
                out.push_back(it->second);
                cache.emplace(word, std::make_pair(begin, size_t{1}));
                continue;
            }
        }
        symbols.clear();
        for (size_t k = 0; k < word.size(); ++k) {
            int32_t id = vocab_.byte_token[static_cast<uint8_t>(word[k])];
            if (id < 0) id = vocab_.unk;  // only in a broken vocabulary
            symbols.push_back({id, 0, 0, static_cast<int32_t>(k) - 1,
                               k + 1 < word.size() ? static_cast<int32_t>(k) + 1 : -1});
        }
        for (int32_t k = 0; k + 1 < static_cast<int32_t>(symbols.size()); ++k) push_candidate(k);
        // Byte-level candidates carry token ids (not byte ends) in left_end/right_end.
        while (!queue.empty()) {
            Candidate c = queue.top();
            queue.pop();
            Symbol& left = symbols[c.left];
            if (left.id < 0 || left.next != c.right || static_cast<uint32_t>(left.id) != c.left_end) continue;
            Symbol& right = symbols[c.right];
            if (right.id < 0 || static_cast<uint32_t>(right.id) != c.right_end) continue;
            uint64_t key = (static_cast<uint64_t>(left.id) << 32) | static_cast<uint32_t>(right.id);
            left.id = vocab_.merges.at(key).result;
            left.next = right.next;
            if (right.next >= 0) symbols[right.next].prev = c.left;
            right.id = -1;
            if (left.prev >= 0) push_candidate(left.prev);
            push_candidate(c.left);
        }
        for (int32_t k = symbols.empty() ? -1 : 0; k >= 0; k = symbols[k].next)
            if (symbols[k].id >= 0) out.push_back(symbols[k].id);
        if (cache.size() < 100000) cache.emplace(word, std::make_pair(begin, out.size() - begin));
    }
}

void Tokenizer::encode_sentencepiece(std::string_view fragment, bool add_prefix, std::vector<int32_t>& out) const {
    std::string text;
    text.reserve(fragment.size() + 8);
    if (add_prefix) text += kSpmSpace;
    for (char c : fragment) {
        if (c == ' ') text += kSpmSpace;
        else text += c;
    }
    if (text.empty()) return;
    // Merge each stretch between barrier bytes on its own (exact: no token spans one).
    size_t begin = 0;
    for (size_t k = 0; k < text.size(); ++k) {
        auto byte = static_cast<uint8_t>(text[k]);
        if (byte >= 128 || !vocab_.merge_barrier[byte]) continue;
        if (k > begin) merge_sentencepiece(std::string_view(text).substr(begin, k - begin), out);
        merge_sentencepiece(std::string_view(text).substr(k, 1), out);
        begin = k + 1;
    }
    if (begin < text.size()) merge_sentencepiece(std::string_view(text).substr(begin), out);
}

void Tokenizer::merge_sentencepiece(std::string_view text, std::vector<int32_t>& out) const {
    std::vector<Symbol> symbols;
    for (size_t k = 0; k < text.size();) {
        size_t length = std::min(utf8_sequence_length(static_cast<uint8_t>(text[k])), text.size() - k);
        int32_t index = static_cast<int32_t>(symbols.size());
        symbols.push_back({0, static_cast<uint32_t>(k), static_cast<uint32_t>(k + length), index - 1, -1});
        if (index > 0) symbols[index - 1].next = index;
        k += length;
    }

    std::priority_queue<Candidate> queue;
    auto push_candidate = [&](int32_t left) {
        if (left < 0) return;
        int32_t right = symbols[left].next;
        if (right < 0) return;
        std::string_view merged(text.data() + symbols[left].start, symbols[right].end - symbols[left].start);
        if (merged.size() > vocab_.max_token_bytes) return;
        auto it = vocab_.ids.find(merged);
        if (it == vocab_.ids.end()) return;
        queue.push({vocab_.scores[it->second], left, right, symbols[left].end, symbols[right].end});
    };
    for (int32_t k = 0; k + 1 < static_cast<int32_t>(symbols.size()); ++k) push_candidate(k);
    while (!queue.empty()) {
        Candidate c = queue.top();
        queue.pop();
        Symbol& left = symbols[c.left];
        Symbol& right = symbols[c.right];
        // Stale if either side was merged away or has grown since the candidate was made.
        if (left.id < 0 || right.id < 0 || left.next != c.right || left.end != c.left_end ||
            right.end != c.right_end)
            continue;
        left.end = right.end;
        left.next = right.next;
        if (right.next >= 0) symbols[right.next].prev = c.left;
        right.id = -1;
        push_candidate(left.prev);
        push_candidate(c.left);
    }

    for (int32_t k = 0; k >= 0; k = symbols[k].next) {
        std::string_view piece(text.data() + symbols[k].start, symbols[k].end - symbols[k].start);
        auto it = vocab_.ids.find(piece);
        if (it != vocab_.ids.end()) {
            out.push_back(it->second);
            continue;
        }
        // Not in the vocabulary (only single characters get here): one token per byte.
        for (char byte : piece) {
            int32_t id = vocab_.byte_token[static_cast<uint8_t>(byte)];
            out.push_back(id >= 0 ? id : vocab_.unk);
        }
    }
}

std::string Tokenizer::token_bytes(int32_t id, bool after_boundary, const DecodeOptions& options) const {
    if (id < 0 || id >= vocab_.size()) fail("tokenizer: token id " + std::to_string(id) + " is out of range");
    const std::string& text = vocab_.tokens[id];
    switch (vocab_.types[id]) {
        case TokenType::control:
            return options.render_special ? text : std::string();
        case TokenType::unknown:
            return options.render_special ? text : std::string("\xEF\xBF\xBD");
        case TokenType::unused:
            return {};
        case TokenType::byte:
            if (vocab_.kind == VocabKind::sentencepiece && text.size() == 6)
                return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
            break;
        default:
            break;
    }
    std::string out;
    if (vocab_.kind == VocabKind::byte_bpe) {
        if (vocab_.types[id] == TokenType::user_defined) return text;
        // Each code point of a byte-level token stands for one byte.
        for (uint32_t cp : decode_utf8(text)) {
            int byte = byte_from_codepoint(cp);
            if (byte >= 0) out += static_cast<char>(byte);
            else append_utf8(out, cp);
        }
        return out;
    }
    for (size_t k = 0; k < text.size();) {
        if (text.compare(k, kSpmSpace.size(), kSpmSpace) == 0) {
            out += ' ';
            k += kSpmSpace.size();
        } else {
            out += text[k++];
        }
    }
    if (after_boundary && vocab_.add_space_prefix && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, const DecodeOptions& options) const {
    std::string out;
    bool after_boundary = true;
    for (int32_t id : ids) {
        out += token_bytes(id, after_boundary, options);
        after_boundary = vocab_.is_matched_in_text(id);
    }
    return out;
}

std::string StreamDecoder::push(int32_t id) {
    pending_ += tokenizer_.token_bytes(id, after_boundary_, options_);
    after_boundary_ = tokenizer_.vocab().is_matched_in_text(id);
    size_t hold = utf8_incomplete_tail(pending_);
    std::string ready = sanitize_utf8(std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
    return ready;
}

std::string StreamDecoder::finish() {
    std::string rest = sanitize_utf8(pending_);
    pending_.clear();
    after_boundary_ = true;
    return rest;
}

}  // namespace spillway
