"""Episodes: multi-turn conversations between the policy and an environment, kept token in, token
out (types.py), rendered with the model's own chat template (chat.py) and run turn by turn against
any sampler (loop.py)."""
