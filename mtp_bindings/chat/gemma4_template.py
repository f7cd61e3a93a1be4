"""Gemma 4's chat format as a Jinja template: the fallback for a GGUF without
``tokenizer.chat_template``.

Our own text, written from the format that Google's Gemma 4 template and llama.cpp's Gemma 4
parser implement (``models/templates/google-gemma-4-31B-it.jinja`` and ``common/chat.cpp`` in
llama.cpp):

* turns are ``<|turn>ROLE\\n ... <turn|>\\n`` with the roles ``system``, ``user`` and ``model``
  (OpenAI's ``assistant``); a ``system``/``developer`` first message, ``enable_thinking`` (the
  ``<|think|>`` switch) and the tool declarations share one system turn at the top;
* a tool is declared as ``<|tool>declaration:NAME{description:...,parameters:{...}}<tool|>``,
  with Gemma's value syntax: strings in ``<|"|>`` quotes, bare keys, JSON numbers and booleans;
* the model calls a tool with ``<|tool_call>call:NAME{key:value,...}<tool_call|>``; the results
  follow in the same model turn as ``<|tool_response>response:NAME{...}<tool_response|>``, and
  the model goes on in that turn;
* the model thinks in a channel, ``<|channel>thought\\n ... <channel|>``; earlier turns' thoughts
  are dropped from the prompt, except those before the current turn's tool calls; without
  ``enable_thinking`` the generation prompt closes an empty thought channel so the model answers
  directly.

One difference from Google's template, on purpose: after a model turn that already holds its
content (so it was closed with ``<turn|>``), ``add_generation_prompt`` opens a new model turn,
where Google's leaves the prompt without one (llama.cpp adds it in code).
"""

from __future__ import annotations

GEMMA4_TEMPLATE = r"""
{%- macro gval(v, quote_keys=true) -%}
{%- if v is string -%}<|"|>{{ v }}<|"|>
{%- elif v is boolean -%}{{ 'true' if v else 'false' }}
{%- elif v is mapping -%}{
{%- for k, x in v | dictsort -%}
{{- ('<|"|>' ~ k ~ '<|"|>') if quote_keys else k }}:{{ gval(x, quote_keys) }}{{ '' if loop.last else ',' }}
{%- endfor -%}}
{%- elif v is iterable -%}[
{%- for x in v -%}{{ gval(x, quote_keys) }}{{ '' if loop.last else ',' }}{%- endfor -%}]
{%- else -%}{{ v }}
{%- endif -%}
{%- endmacro -%}

{%- macro quoted_list(items) -%}
[{%- for x in items -%}<|"|>{{ x }}<|"|>{{ '' if loop.last else ',' }}{%- endfor -%}]
{%- endmacro -%}

{%- macro array_items(items) -%}
{%- set out = namespace(parts=[]) -%}
{%- for k, x in items | dictsort if x is not none -%}
{%- if k == 'properties' -%}
{%- set inner = props(x, items['required'] | default([])) if x is mapping else '' -%}
{%- set out.parts = out.parts + ['properties:{' ~ inner ~ '}'] -%}
{%- elif k == 'required' -%}
{%- set out.parts = out.parts + ['required:' ~ quoted_list(x)] -%}
{%- elif k == 'type' -%}
{%- set out.parts = out.parts + ['type:' ~ gval(x | upper if x is string else x | map('upper') | list)] -%}
{%- else -%}
{%- set out.parts = out.parts + [k ~ ':' ~ gval(x)] -%}
{%- endif -%}
{%- endfor -%}
items:{ {{- out.parts | join(',') -}} }
{%- endmacro -%}

{%- macro props(properties, required) -%}
{%- set sep = namespace(on=false) -%}
{%- for name, p in properties | dictsort -%}
{%- if name not in ['description', 'type', 'properties', 'required', 'nullable'] -%}
{{- ',' if sep.on else '' -}}
{%- set sep.on = true -%}
{%- set kind = p['type'] | upper -%}
{%- set out = namespace(parts=[]) -%}
{%- if p['description'] -%}
{%- set out.parts = out.parts + ['description:<|"|>' ~ p['description'] ~ '<|"|>'] -%}
{%- endif -%}
{%- if kind == 'STRING' and p['enum'] -%}{%- set out.parts = out.parts + ['enum:' ~ gval(p['enum'])] -%}{%- endif -%}
{%- if kind == 'ARRAY' and p['items'] is mapping and p['items'] -%}
{%- set out.parts = out.parts + [array_items(p['items'])] -%}
{%- endif -%}
{%- if p['nullable'] -%}{%- set out.parts = out.parts + ['nullable:true'] -%}{%- endif -%}
{%- if kind == 'OBJECT' -%}
{%- set inner = p['properties'] if p['properties'] is defined and p['properties'] is mapping else p -%}
{%- set out.parts = out.parts + ['properties:{' ~ props(inner, p['required'] | default([])) ~ '}'] -%}
{%- if p['required'] -%}{%- set out.parts = out.parts + ['required:' ~ quoted_list(p['required'])] -%}{%- endif -%}
{%- endif -%}
{%- set out.parts = out.parts + ['type:<|"|>' ~ kind ~ '<|"|>'] -%}
{{ name }}:{ {{- out.parts | join(',') -}} }
{%- endif -%}
{%- endfor -%}
{%- endmacro -%}

{%- macro declaration(tool) -%}
{%- set f = tool['function'] -%}
declaration:{{ f['name'] }}{description:<|"|>{{ f['description'] }}<|"|>
{%- set params = f['parameters'] -%}
{%- if params -%},parameters:{
{%- if params['properties'] -%}properties:{ {{- props(params['properties'], params['required']) -}} },{%- endif -%}
{%- if params['required'] -%}required:{{ quoted_list(params['required']) }},{%- endif -%}
{%- if params['type'] -%}type:<|"|>{{ params['type'] | upper }}<|"|>}{%- endif -%}
{%- endif -%}
{%- if 'response' in f -%},response:{
{%- if f['response']['description'] -%}description:<|"|>{{ f['response']['description'] }}<|"|>,{%- endif -%}
{%- if f['response']['type'] | upper == 'OBJECT' -%}type:<|"|>{{ f['response']['type'] | upper }}<|"|>}{%- endif -%}
{%- endif -%}}
{%- endmacro -%}

{%- macro answer_only(text) -%}
{%- set out = namespace(s='') -%}
{%- for chunk in text.split('<channel|>') -%}
{%- set out.s = out.s ~ (chunk.split('<|channel>')[0] if '<|channel>' in chunk else chunk) -%}
{%- endfor -%}
{{ out.s | trim }}
{%- endmacro -%}

{%- macro text_of(content, is_model) -%}
{%- if content is string -%}{{ answer_only(content) if is_model else content | trim }}
{%- elif content is iterable -%}
{%- for part in content -%}
{%- if part['type'] == 'text' -%}{{ answer_only(part['text']) if is_model else part['text'] | trim }}
{%- elif part['type'] in ['image', 'audio', 'video'] -%}{{ '<|' ~ part['type'] ~ '|>' }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}

{%- macro joined_text(content) -%}
{%- for part in content if part['type'] == 'text' -%}{{ part['text'] | default('') }}{%- endfor -%}
{%- endmacro -%}

{%- macro response_block(name, body) -%}
<|tool_response>response:{{ name }}{
{%- if body is mapping -%}
{%- for k, x in body | dictsort -%}{{ k }}:{{ gval(x, false) }}{{ '' if loop.last else ',' }}{%- endfor -%}
{%- else -%}value:{{ gval(body, false) }}
{%- endif -%}}<tool_response|>
{%- endmacro -%}

{{- bos_token -}}
{%- set thinking = enable_thinking is defined and enable_thinking -%}
{%- set rest = messages -%}
{%- if thinking or tools or messages[0]['role'] in ['system', 'developer'] -%}
{{- '<|turn>system\n' ~ ('<|think|>\n' if thinking else '') -}}
{%- if messages[0]['role'] in ['system', 'developer'] -%}
{{- messages[0]['content'] | trim -}}
{%- set rest = messages[1:] -%}
{%- endif -%}
{%- for tool in tools or [] -%}<|tool>{{ declaration(tool) | trim }}<tool|>{%- endfor -%}
{{- '<turn|>\n' -}}
{%- endif -%}

{%- set state = namespace(last_user=-1, open=false, prev=none) -%}
{%- for m in rest -%}{%- if m['role'] == 'user' -%}{%- set state.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}

{%- for m in rest -%}
{%- if m['role'] != 'tool' -%}
{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}
{%- if not (role == 'model' and state.prev == 'assistant') -%}{{ '<|turn>' ~ role ~ '\n' }}{%- endif -%}
{%- set state.prev = m['role'] -%}
{%- set state.open = true -%}
{%- set calls = m['tool_calls'] or [] -%}
{%- set thought = m['reasoning'] or m['reasoning_content'] -%}
{%- if thought and calls and loop.index0 > state.last_user -%}
{{- '<|channel>thought\n' ~ thought ~ '\n<channel|>' -}}
{%- endif -%}
{%- for call in calls -%}
<|tool_call>call:{{ call['function']['name'] }}{
{%- set args = call['function']['arguments'] -%}
{%- if args is mapping -%}
{%- for k, x in args | dictsort -%}{{ k }}:{{ gval(x, false) }}{{ '' if loop.last else ',' }}{%- endfor -%}
{%- elif args is string -%}{{ args }}
{%- endif -%}}<tool_call|>
{%- endfor -%}
{%- set answered = namespace(any=false, stop=false) -%}
{%- if m['tool_responses'] -%}
{%- for r in m['tool_responses'] -%}{{ response_block(r['name'] | default('unknown'), r['response']) }}{%- endfor -%}
{%- set answered.any = true -%}
{%- elif calls -%}
{%- for k in range(loop.index0 + 1, rest | length) -%}
{%- if answered.stop or rest[k]['role'] != 'tool' -%}
{%- set answered.stop = true -%}
{%- else -%}
{%- set reply = rest[k] -%}
{%- set fn = namespace(name=reply['name'] or 'unknown') -%}
{%- for call in calls if call['id'] is defined and call['id'] == reply['tool_call_id'] -%}
{%- set fn.name = call['function']['name'] -%}
{%- endfor -%}
{%- set body = reply['content'] if reply['content'] is string or reply['content'] is not iterable
    else joined_text(reply['content']) -%}
{{- response_block(fn.name, body) -}}
{%- set answered.any = true -%}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- text_of(m['content'], role == 'model') -}}
{%- if calls and not answered.any -%}{{ '<|tool_response>' }}
{%- elif answered.any and not m['content'] -%}
{%- else -%}{{ '<turn|>\n' }}{%- set state.open = false -%}
{%- endif -%}
{%- endif -%}
{%- endfor -%}

{%- if add_generation_prompt and not state.open -%}
{{- '<|turn>model\n' ~ ('' if thinking else '<|channel>thought\n<channel|>') -}}
{%- endif -%}
"""
