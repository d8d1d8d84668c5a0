"""What SQL exists: tables, bind names and statement builders; pure, no I/O (nothing here awaits)."""
