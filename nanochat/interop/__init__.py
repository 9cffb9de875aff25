"""Leaving the project: the Hugging Face export (hf/) and lm-evaluation-harness (lm_eval_*)."""
