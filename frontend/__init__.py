"""The browser console: server-rendered Django pages over the same selectors the API uses."""
