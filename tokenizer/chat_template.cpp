#include "tokenizer/chat_template.h"

#include "common/error.h"

namespace spillway {
namespace {

constexpr std::string_view kQwenDefaultSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// Jinja's `trim` filter (Python str.strip()): ASCII whitespace at both ends is enough for
// the prompts we build.
std::string_view trim(std::string_view s) {
    constexpr std::string_view spaces = " \t\n\r\v\f";
    size_t begin = s.find_first_not_of(spaces);
    if (begin == std::string_view::npos) return {};
    size_t end = s.find_last_not_of(spaces);
    return s.substr(begin, end - begin + 1);
}

std::vector<ChatMessage> with_system(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                                     const ChatOptions& options) {
    bool has_system = !messages.empty() && messages.front().role == "system";
    std::vector<ChatMessage> all;
    if (!has_system) {
        if (options.system_prompt) all.push_back({"system", *options.system_prompt});
        else if (!chat_template.default_system.empty()) all.push_back({"system", chat_template.default_system});
    }
    all.insert(all.end(), messages.begin(), messages.end());
    return all;
}

}  // namespace

ChatTemplate chat_template_from_string(std::string_view jinja_template) {
    ChatTemplate result;
    if (jinja_template.find("<|im_start|>") != std::string_view::npos) {
        result.format = ChatFormat::chatml;
        if (jinja_template.find(kQwenDefaultSystem) != std::string_view::npos)
            result.default_system = std::string(kQwenDefaultSystem);
        return result;
    }
    if (jinja_template.find("<|start_header_id|>") != std::string_view::npos) {
        result.format = ChatFormat::llama3;
        return result;
    }
    if (jinja_template.empty())
        fail("chat: the model has no tokenizer.chat_template; known formats are ChatML (Qwen) and Llama 3");
    fail("chat: unknown tokenizer.chat_template (it has neither \"<|im_start|>\" for ChatML nor "
         "\"<|start_header_id|>\" for Llama 3): " + std::string(jinja_template.substr(0, 80)) + "...");
}

std::string format_chat(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options) {
    std::string out;
    for (const ChatMessage& message : with_system(chat_template, messages, options)) {
        if (message.role.empty()) fail("chat: a message has an empty role");
        switch (chat_template.format) {
            case ChatFormat::chatml:
                out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
                break;
            case ChatFormat::llama3:
                out += "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n";
                out += trim(message.content);
                out += "<|eot_id|>";
                break;
        }
    }
    if (options.add_generation_prompt) {
        switch (chat_template.format) {
            case ChatFormat::chatml: out += "<|im_start|>assistant\n"; break;
            case ChatFormat::llama3: out += "<|start_header_id|>assistant<|end_header_id|>\n\n"; break;
        }
    }
    return out;
}

}  // namespace spillway
