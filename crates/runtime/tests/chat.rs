//! Chat templates against transformers: the Qwen3 template rendered by `apply_chat_template`
//! (fixtures/chat, made by tools/fixtures), plus Python-parity details the fixture does not cover
//! (`tojson` formatting, trim/lstrip blocks, `raise_exception`, config variants). Expected strings
//! not from fixtures were produced by Python 3 `json.dumps` / jinja2 3.1 and pasted.

use std::path::PathBuf;

use runtime::{ChatMessage, ChatTemplate, RenderOptions, RuntimeError};

fn fixtures() -> PathBuf {
    testdata::fixtures().to_path_buf()
}

fn read(path: &str) -> String {
    let path = fixtures().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn qwen3() -> ChatTemplate {
    ChatTemplate::from_model_dir(&fixtures().join("tokenizers/qwen3")).unwrap()
}

fn conversation() -> Vec<ChatMessage> {
    serde_json::from_str(&read("chat/qwen3_conversation.json")).unwrap()
}

fn options(add_generation_prompt: bool) -> RenderOptions {
    RenderOptions {
        add_generation_prompt,
        ..RenderOptions::default()
    }
}

#[test]
fn qwen3_matches_transformers_with_generation_prompt() {
    let rendered = qwen3().render(&conversation(), &options(true)).unwrap();
    assert_eq!(rendered, read("chat/qwen3_rendered.txt"));
}

#[test]
fn qwen3_matches_transformers_without_generation_prompt() {
    let rendered = qwen3().render(&conversation(), &options(false)).unwrap();
    assert_eq!(rendered, read("chat/qwen3_rendered_no_gen.txt"));
}

#[test]
fn qwen3_matches_transformers_with_thinking_disabled() {
    let mut opts = options(true);
    opts.extra.insert("enable_thinking".into(), false.into());
    let rendered = qwen3().render(&conversation(), &opts).unwrap();
    assert_eq!(rendered, read("chat/qwen3_rendered_no_think.txt"));
}

#[test]
fn qwen3_renders_reasoning_after_the_last_user_turn() {
    // An assistant turn after the last user query keeps its think block, from
    // `reasoning_content` when given (Qwen3 template semantics).
    let mut messages = conversation();
    let mut answer = ChatMessage::new("assistant", "Berlin.");
    answer.reasoning_content = Some("\nGermany's capital.\n".into());
    messages.push(answer);
    let rendered = qwen3().render(&messages, &options(false)).unwrap();
    let tail =
        "<|im_start|>assistant\n<think>\nGermany's capital.\n</think>\n\nBerlin.<|im_end|>\n";
    assert!(rendered.ends_with(tail), "{rendered}");
}

#[test]
fn qwen3_special_tokens_come_from_the_tokenizer_config() {
    let template = qwen3();
    assert_eq!(template.eos_token(), Some("<|im_end|>"));
    assert_eq!(template.bos_token(), None, "Qwen3's bos_token is null");
}

#[test]
fn qwen3_tool_definitions_are_rendered_with_python_json() {
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let opts = RenderOptions {
        add_generation_prompt: true,
        tools: Some(tools),
        ..RenderOptions::default()
    };
    let rendered = qwen3()
        .render(&[ChatMessage::new("user", "Weather?")], &opts)
        .unwrap();
    let line = r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#;
    assert!(
        rendered.contains(&format!("<tools>\n{line}\n</tools>")),
        "{rendered}"
    );
}

/// Renders `{{ x | tojson(...) }}` with `x` given as JSON.
fn tojson(value: serde_json::Value, args: &str) -> String {
    let template =
        ChatTemplate::new(format!("{{{{ x | tojson{args} }}}}"), vec![], "test").unwrap();
    let mut opts = RenderOptions::default();
    opts.extra.insert("x".into(), value);
    template
        .render_value(&serde_json::json!([]), &opts)
        .unwrap()
}

fn sample() -> serde_json::Value {
    serde_json::json!({"b": [1, 2.5, "é\n\"\t\u{1}", null, true], "a": {}, "z": [],
                       "f": [1e-05, 1e16, 123456789.0, 0.1]})
}

#[test]
fn tojson_matches_python_json_dumps() {
    assert_eq!(
        tojson(sample(), ""),
        r#"{"b": [1, 2.5, "é\n\"\t\u0001", null, true], "a": {}, "z": [], "f": [1e-05, 1e+16, 123456789.0, 0.1]}"#
    );
}

#[test]
fn tojson_indent_matches_python() {
    let expected = "{\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\\\"\\t\\u0001\",\n    null,\n    true\n  ],\n  \"a\": {},\n  \"z\": [],\n  \"f\": [\n    1e-05,\n    1e+16,\n    123456789.0,\n    0.1\n  ]\n}";
    assert_eq!(tojson(sample(), "(indent=2)"), expected);
}

#[test]
fn tojson_sort_keys_and_ensure_ascii_match_python() {
    let value = serde_json::json!({"é": "😀", "b": 1, "a": 2});
    assert_eq!(
        tojson(value, "(ensure_ascii=true, sort_keys=true)"),
        r#"{"a": 2, "b": 1, "\u00e9": "\ud83d\ude00"}"#
    );
}

#[test]
fn trim_and_lstrip_blocks_match_transformers_environment() {
    // jinja2 with trim_blocks=True, lstrip_blocks=True renders this as '<s>\n  [hi]\nend'.
    let source = "<s>\n{% for m in messages %}\n    {% if m.role == \"user\" %}\n  [{{ m.content | trim }}]\n    {% endif %}\n{% endfor %}\nend\n";
    let template = ChatTemplate::new(source, vec![], "test").unwrap();
    let messages = [
        ChatMessage::new("user", " hi "),
        ChatMessage::new("bot", "x"),
    ];
    assert_eq!(
        template.render(&messages, &options(false)).unwrap(),
        "<s>\n  [hi]\nend"
    );
}

#[test]
fn raise_exception_surfaces_the_templates_message() {
    let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
    let template = ChatTemplate::new(source, vec![], "strict.jinja").unwrap();
    let err = template
        .render(&[ChatMessage::new("assistant", "hi")], &options(false))
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("Conversation must start with user"), "{msg}");
    assert!(
        msg.contains("strict.jinja") && msg.contains("render"),
        "{msg}"
    );
    assert_eq!(
        template
            .render(&[ChatMessage::new("user", "hi")], &options(false))
            .unwrap(),
        "ok"
    );
}

#[test]
fn special_tokens_given_as_added_token_objects_are_read() {
    let config = r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                     "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}"#;
    let template = ChatTemplate::from_tokenizer_config(config, "cfg").unwrap();
    assert_eq!(template.bos_token(), Some("<s>"));
    let out = template
        .render(&[ChatMessage::new("user", "hi")], &options(false))
        .unwrap();
    assert_eq!(out, "<s>hi</s>");
}

#[test]
fn named_template_lists_use_the_default_one() {
    let config = r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                       {"name": "default", "template": "D{{ messages|length }}"}]}"#;
    let template = ChatTemplate::from_tokenizer_config(config, "cfg").unwrap();
    assert_eq!(template.render(&[], &options(false)).unwrap(), "D0");
    let config = r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#;
    let err = ChatTemplate::from_tokenizer_config(config, "cfg").unwrap_err();
    assert!(err.to_string().contains("tool_use"), "{err}");
}

#[test]
fn config_errors_name_the_origin() {
    let err =
        ChatTemplate::from_tokenizer_config(r#"{"eos_token": "x"}"#, "base/tokenizer_config.json")
            .unwrap_err();
    assert!(matches!(err, RuntimeError::Config { .. }));
    assert!(
        err.to_string().contains("base/tokenizer_config.json"),
        "{err}"
    );
    let err = ChatTemplate::new("{% if %}", vec![], "broken.jinja").unwrap_err();
    assert!(
        err.to_string().contains("broken.jinja") && err.to_string().contains("compile"),
        "{err}"
    );
    let err = ChatTemplate::from_model_dir(&fixtures().join("does-not-exist")).unwrap_err();
    assert!(matches!(err, RuntimeError::Io { .. }), "{err}");
}
