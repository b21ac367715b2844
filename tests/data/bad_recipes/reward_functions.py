"""A user reward next to the bad recipes that name it (never imported by the checks: they read it as text)."""
raise RuntimeError("the recipe checks must not run this file")


def shorter_is_better(prompts, completions, completion_ids, **columns):
    return [-len(ids) for ids in completion_ids]
