"""Keep litellm off the network: import this module before anything imports litellm.

litellm reads these at import time. Without them every import tries to fetch the model cost map
(+5-10 s where the network blackholes) and a streamed call for some model names fetches a
tokenizer from the Hugging Face hub, blocking the event loop. `setdefault` lets an operator who
really wants the live cost map opt back in from the environment.
"""

import os

os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")  # litellm >= 1.110
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # older litellm: bundled cost map
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tokenizers for token counting
