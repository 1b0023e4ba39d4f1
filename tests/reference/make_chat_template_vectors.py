#!/usr/bin/env python3
"""Reference renderings of real chat templates, for tests/engine/chat_template_test.cc.

specinfer has no Jinja engine: ChatTemplate recognises a model's template by characteristic markers
and maps it to a built-in formatter (as llama.cpp's llama_chat_apply_template does). This script
renders the *real* Jinja templates with Python's jinja2, configured as Hugging Face transformers
does in apply_chat_template (sandboxed environment, trim_blocks, lstrip_blocks, a
raise_exception() global), over a set of conversations, and writes the results to
tests/data/chat/templates.json. The C++ test feeds each template source to
ChatTemplate::FromModelTemplate and demands byte-exact equality with every rendering; a
conversation the template rejects (raise_exception) is recorded with "error" and must be an
InvalidArgument in C++.

Template sources:
  smollm2  - tokenizer.chat_template of models/SmolLM2-135M-Instruct.Q4_1.gguf (read with gguf when
             the model is present; otherwise the copy embedded below, which is the same text).
  chatml   - teknium/OpenHermes-2.5-Mistral-7B, as listed in llama.cpp tests/test-chat-template.cpp.
  llama2   - meta-llama/Llama-2-7b-chat-hf tokenizer_config.json "chat_template" (also listed in
             llama.cpp's tests/test-chat-template.cpp and in many downstream copies).
  llama3   - meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json "chat_template" (the revision
             with the add_generation_prompt guard; llama.cpp's test lists the earlier one).
  gemma3   - google/gemma-3-*-it tokenizer_config.json "chat_template" (Gemma 3: the system message
             is prepended to the first user turn, followed by a blank line).
  gemma2   - google/gemma-2-2b-it tokenizer_config.json "chat_template" (BOS, and a system message
             is an error: raise_exception('System role not supported')).
  gemma-7b-it - google/gemma-7b-it's template, from llama.cpp tests/test-chat-template.cpp: as
             gemma2 without bos_token (the tokenizer adds BOS).
  unrecognised - zephyr's template (<|user|> ...): a format specinfer does not implement
             (FromModelTemplate must say Unimplemented).

Each template entry names its "family" (ChatTemplate::name()) and whether
ChatTemplate::Named(family) renders like it ("named"; only where the template adds nothing).
When transformers is installed, every rendering is also made by transformers'
render_jinja_template (what tokenizer.apply_chat_template(tokenize=False) runs) and must be the
same string: the jinja2 set-up below is transformers'.

Usage: python3 tests/reference/make_chat_template_vectors.py [--check]
Requires: jinja2 (pip install jinja2); gguf and transformers optional.
"""
import argparse
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "chat", "templates.json")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

GEMMA_7B = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)

GEMMA2 = "{{ bos_token }}" + GEMMA_7B

# Lines joined with real newlines, as the JSON string holds them; '\\n' in Jinja literals.
GEMMA3 = "\n".join([
    "{{ bos_token }}",
    "{%- if messages[0]['role'] == 'system' -%}",
    "    {%- if messages[0]['content'] is string -%}",
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}",
    "    {%- else -%}",
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}",
    "    {%- endif -%}",
    "    {%- set loop_messages = messages[1:] -%}",
    "{%- else -%}",
    "    {%- set first_user_prefix = \"\" -%}",
    "    {%- set loop_messages = messages -%}",
    "{%- endif -%}",
    "{%- for message in loop_messages -%}",
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}",
    "        {{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}",
    "    {%- endif -%}",
    "    {%- if (message['role'] == 'assistant') -%}",
    "        {%- set role = \"model\" -%}",
    "    {%- else -%}",
    "        {%- set role = message['role'] -%}",
    "    {%- endif -%}",
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}",
    "    {%- if message['content'] is string -%}",
    "        {{ message['content'] | trim }}",
    "    {%- elif message['content'] is iterable -%}",
    "        {%- for item in message['content'] -%}",
    "            {%- if item['type'] == 'image' -%}",
    "                {{ '<start_of_image>' }}",
    "            {%- elif item['type'] == 'text' -%}",
    "                {{ item['text'] | trim }}",
    "            {%- endif -%}",
    "        {%- endfor -%}",
    "    {%- else -%}",
    "        {{ raise_exception(\"Invalid content type\") }}",
    "    {%- endif -%}",
    "    {{ '<end_of_turn>\\n' }}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}",
    "    {{'<start_of_turn>model\\n'}}",
    "{%- endif -%}",
    "",
])

ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
    "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n"
    "{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)


def smollm2_source():
    try:
        from gguf import GGUFReader  # noqa: PLC0415
    except ImportError:
        return SMOLLM2
    if not os.path.exists(MODEL):
        return SMOLLM2
    r = GGUFReader(MODEL)
    f = r.fields["tokenizer.chat_template"]
    text = bytes(f.parts[f.data[0]]).decode()
    if text != SMOLLM2:
        sys.exit("the model's chat template differs from the embedded SmolLM2 copy")
    return text


def S(c):
    return {"role": "system", "content": c}


def U(c):
    return {"role": "user", "content": c}


def A(c):
    return {"role": "assistant", "content": c}


# (name, messages, add_generation_prompt)
CONVERSATIONS = [
    ("single_user", [U("What is the capital of France?")], True),
    ("single_user_no_prompt", [U("Hello")], False),
    ("system_user", [S("You are a terse assistant."), U("Name a prime number.")], True),
    ("multi_turn_system", [S("You are a helpful assistant"), U("Hello"), A("Hi there"),
                           U("Who are you"), A("   I am an assistant   "),
                           U("Another question")], True),
    ("multi_turn_ends_assistant", [U("2+2?"), A("4"), U("And 3+3?"), A("6")], False),
    ("unicode", [S("Réponds en français. 日本語も OK 🚀"),
                 U("Qu'est-ce que «ça» veut dire ? Ünïcödé — ✓"), A("Ça = “that” 😊"),
                 U("Merci !")], True),
    ("whitespace_and_newlines", [U("  \n  line one\nline two\t \n"), A("\n answer \n"),
                                 U("\u3000wide space\u00a0")], True),
    ("empty_contents", [S(""), U("")], True),
    ("system_only", [S("Only a system prompt.")], True),
    ("consecutive_users", [U("first"), U("second")], True),
    ("assistant_first", [A("Welcome!"), U("Thanks")], True),
    ("special_text_in_content", [U("Say <b>hi</b> & [INST] {{ not jinja }} '\"\\n")], False),
]

# (name, source, bos_token, eos_token, family, Named(family) renders the same)
TEMPLATES = [
    ("smollm2", None, "<|im_start|>", "<|im_end|>", "chatml", False),
    ("chatml", CHATML, "<s>", "<|im_end|>", "chatml", True),
    ("llama2", LLAMA2, "<s>", "</s>", "llama2", True),
    ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "llama3", True),
    ("gemma3", GEMMA3, "<bos>", "<eos>", "gemma", True),
    ("gemma2", GEMMA2, "<bos>", "<eos>", "gemma", False),
    ("gemma-7b-it", GEMMA_7B, "<bos>", "<eos>", "gemma", False),
]


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def render(env, source, messages, add_generation_prompt, bos, eos):
    tmpl = env.from_string(source)
    return tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                       bos_token=bos, eos_token=eos)


def transformers_render():
    """transformers' renderer, or None when transformers is not installed."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template  # noqa: PLC0415
    except ImportError:
        return None

    def render_hf(source, messages, add_generation_prompt, bos, eos):
        try:
            rendered, _ = render_jinja_template(conversations=[messages], chat_template=source,
                                                add_generation_prompt=add_generation_prompt,
                                                bos_token=bos, eos_token=eos)
        except Exception as e:  # noqa: BLE001 - transformers' TemplateError
            if "raise_exception" in repr(e) or type(e).__name__ == "TemplateError":
                return None
            raise
        return rendered[0]
    return render_hf


def build():
    # As transformers.utils.chat_template_utils._compile_jinja_template.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    out = {
        "generator": "tests/reference/make_chat_template_vectors.py",
        "jinja2_version": jinja2.__version__,
        "templates": [],
        "unrecognised": [{"name": "zephyr", "source": ZEPHYR}, {"name": "plain-text",
                                                                "source": "INVALID TEMPLATE"}],
    }
    render_hf = transformers_render()
    checked_hf = 0
    for name, source, bos, eos, family, named in TEMPLATES:
        if source is None:
            source = smollm2_source()
        cases = []
        for cname, messages, gen in CONVERSATIONS:
            case = {"name": cname, "messages": messages, "add_generation_prompt": gen}
            try:
                case["expected"] = render(env, source, messages, gen, bos, eos)
            except TemplateError as e:
                case["error"] = str(e)
            if render_hf is not None:
                hf = render_hf(source, messages, gen, bos, eos)
                if hf != case.get("expected"):
                    sys.exit(f"{name}/{cname}: transformers renders {hf!r}, jinja2 "
                             f"{case.get('expected')!r}")
                checked_hf += 1
            cases.append(case)
        out["templates"].append({"name": name, "family": family, "named": named,
                                 "source": source, "bos_token": bos, "eos_token": eos,
                                 "cases": cases})
    if render_hf is not None:
        print(f"transformers' render_jinja_template agrees on {checked_hf} renderings",
              file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the JSON, write nothing")
    args = ap.parse_args()
    data = build()
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    if args.check:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{OUT} is stale: rerun without --check")
        print("ok")
        return
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    n = sum(len(t["cases"]) for t in data["templates"])
    print(f"wrote {OUT}: {len(data['templates'])} templates, {n} cases")


if __name__ == "__main__":
    main()
