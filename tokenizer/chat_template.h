#pragma once
// Chat prompt formats for the models we run, chosen from the GGUF tokenizer.chat_template
// string by its markers. We do not interpret Jinja: each format is written out by hand
// and checked against the reference renderer in the tests.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spillway {

enum class ChatFormat { chatml, llama3 };

struct ChatTemplate {
    ChatFormat format = ChatFormat::chatml;
    // System prompt the template inserts when the conversation has none (Qwen2.5's
    // "You are Qwen, created by Alibaba Cloud..."); empty for none.
    std::string default_system;
};

struct ChatMessage {
    std::string role;  // "system", "user", "assistant"
    std::string content;
};

struct ChatOptions {
    std::optional<std::string> system_prompt;  // -sys: used unless messages start with a system turn
    bool add_generation_prompt = true;         // end with the assistant header
};

// "<|im_start|>" -> ChatML, "<|start_header_id|>" -> Llama 3; anything else (including an
// empty template) throws spillway::Error saying which formats we know.
ChatTemplate chat_template_from_string(std::string_view jinja_template);

// The prompt text, without BOS: the tokenizer adds BOS as the vocabulary asks. Tokenize
// it with parse_special so the role markers become their control tokens.
std::string format_chat(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options = {});

}  // namespace spillway
