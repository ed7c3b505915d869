"""The pure reward functions every service shares: answer extraction and scoring (no I/O)."""
