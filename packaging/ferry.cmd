@echo off
rem Start Ferry on Windows: serve the chat and open it in the browser.
rem Uses the venv made by the installer in %LOCALAPPDATA%\ferry\venv; extra arguments go to serve.
setlocal
set "FERRY_EXE=%LOCALAPPDATA%\ferry\venv\Scripts\ferry.exe"
if exist "%~dp0ferry.exe" set "FERRY_EXE=%~dp0ferry.exe"
if not exist "%FERRY_EXE%" (
  echo Ferry is not installed: %FERRY_EXE% is missing. 1>&2
  echo Create it with: py -3.11 -m venv "%LOCALAPPDATA%\ferry\venv" 1>&2
  exit /b 1
)
"%FERRY_EXE%" serve --open %*
exit /b %ERRORLEVEL%
