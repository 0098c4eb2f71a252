"""Reference numpy models used to evaluate W8A8 matmuls end to end."""
