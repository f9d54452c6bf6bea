"""Optional glue for other frameworks a shop may use; nothing of the app imports it."""
