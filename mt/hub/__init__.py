"""transformers' Marian models: an mt run exported as one, and one imported as an mt run."""
