"""The dashboard's static files (HTML, CSS, ES modules), installed as package data."""
