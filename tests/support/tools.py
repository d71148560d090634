"""Tool declarations the tool-calling tests share: mcp-server-time's `get_current_time` (its
tools/list entry as captured from mcp-server-time 2026.10.19) in the OpenAI `tools` shape."""

from __future__ import annotations

GET_CURRENT_TIME = {
    "type": "function",
    "function": {
        "name": "get_current_time",
        "description": "Get current time in a specific timezone",
        "parameters": {
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "title": "Timezone",
                    "description": "IANA timezone name (e.g., 'America/New_York', 'Europe/London'). Use 'Etc/UTC' as "
                    "local timezone if no timezone provided by the user.",
                }
            },
            "required": ["timezone"],
            "title": "get_current_timeArguments",
        },
    },
}
