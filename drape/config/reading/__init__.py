"""How a config file becomes data: YAML read with bounds (loading), `extends:` merged (extends), the
site file's values put in (site). The models that validate the result are the modules beside this room."""
