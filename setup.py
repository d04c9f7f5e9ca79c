"Install legalnb from the settings in settings.ini (nbdev 2 layout)."
from configparser import ConfigParser
from setuptools import find_packages, setup

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

setup(
    name=cfg['lib_name'], version=cfg['version'], description=cfg['description'],
    long_description=open('README.md', encoding='utf-8').read(), long_description_content_type='text/markdown',
    author=cfg['author'], author_email=cfg['author_email'], license='Apache-2.0', url=cfg['git_url'],
    keywords=cfg['keywords'].split(), python_requires='>=' + cfg['min_python'],
    packages=find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']), include_package_data=True,
    install_requires=cfg['requirements'].split(), extras_require={'dev': cfg['dev_requirements'].split(), 'eval': cfg['eval_requirements'].split(),
                                                        'track': cfg['track_requirements'].split()},
    entry_points={'console_scripts': cfg['console_scripts'].split('\n'), 'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    zip_safe=False)
