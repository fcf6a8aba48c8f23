"""Built-in environments: `calculator.Calculator` (tool calls) and `feedback.Feedback` (retries)."""
