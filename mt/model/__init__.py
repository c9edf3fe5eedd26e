from mt.model.transformer import Transformer, build_model, reorder_cache

__all__ = ["Transformer", "build_model", "reorder_cache"]
