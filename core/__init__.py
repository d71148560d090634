"""gemma-chat's engine and everything without a UI. Never imports textual."""
