"""transformers' Marian models: an mt run exported as one, and one imported as an mt run."""

import re

# a Hugging Face hub id: NAME or OWNER/NAME
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
