"""Accounts and teams: Django users, and teams backed by Django auth groups."""
