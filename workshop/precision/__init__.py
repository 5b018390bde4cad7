"""Fewer bits per weight and what they cost in quality (notebooks 04, 05).

``quantization`` (int4 groups, the teaching engine's quantizer), ``quantization_measure``
(size, speed and agreement measured), ``quantization_plots``, ``model_quality`` (perplexity and
greedy agreement against a reference).
"""
