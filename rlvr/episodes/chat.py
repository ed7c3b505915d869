"""The model's chat template as token-in, token-out operations (INTERFACE: being implemented).

`ChatCodec(tokenizer, tools=None)`:
- ``prompt_ids(messages) -> list[int]``: the episode's first prompt, ``apply_chat_template(messages,
  tools=tools, add_generation_prompt=True)``.
- ``after_turn(conversation, new_messages) -> list[int] | None``: the ids to append after an
  assistant turn's sampled ids (which end with its stop token when it stopped): the rest of the
  assistant turn's closing after the stop token, the new messages (tool results, the environment's
  user reply) and the next generation prompt; computed from the template by rendering, tokenized
  once. ``conversation`` is the conversation so far, the just-sampled assistant message last. None
  when the template does not only append for these messages: the caller starts a new sample from
  ``prompt_ids(conversation + new_messages)``.
- ``parse_tool_calls(text) -> (calls, errors)``: the tool calls in an assistant turn's text.
- ``assistant_message(text, calls) -> dict``: the turn as it enters the conversation.
- ``stop_ids``: the ids that end an assistant turn.
"""
