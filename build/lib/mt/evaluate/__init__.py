"""Evaluation: metrics, systems comparison, reports, pictures, decoding tuned on valid."""
